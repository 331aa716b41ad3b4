"""runner.lora.adapter on real PEFT adapters of a tiny random Llama: a good adapter loads; each
malformed one (config not JSON or not an object, fields of the wrong type, DoRA, corrupt or
truncated safetensors, a missing file or folder, NaN weights, half a pair, a rank past
max_lora_rank, shapes of another base, an unsupported target module) is a ValueError naming
what is wrong, and never another exception; a refused adapter leaves nothing in the manager."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from lora_helpers import MALFORMED, lora_request, make_adapter, malformed_adapters, tiny_llama
from modelyard.engine.config import LoRAConfig
from modelyard.runner.lora.adapter import BaseShapes, read_adapter
from modelyard.runner.lora.manager import LoRAManager

pytestmark = pytest.mark.unit

MAX_RANK = 8


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("lora-base") / "base")


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory, base: Path) -> Path:
    return make_adapter(base, tmp_path_factory.mktemp("lora-good") / "good", seed=1, rank=4)


@pytest.fixture(scope="module")
def malformed(
    tmp_path_factory: pytest.TempPathFactory, base: Path, good: Path
) -> dict[str, tuple[Path, str]]:
    root = tmp_path_factory.mktemp("lora-malformed")
    other_base = tiny_llama(root / "other-base", hidden=48)
    return malformed_adapters(base, good, root, other_base=other_base)


@pytest.fixture(scope="module")
def shapes(base: Path) -> BaseShapes:
    return BaseShapes.of(AutoConfig.from_pretrained(base))


def test_a_good_adapter_loads(good: Path, shapes: BaseShapes) -> None:
    adapter = read_adapter(lora_request("good", good, 1), shapes, MAX_RANK, torch.float32)
    assert len(adapter.weights) == shapes.num_layers * 7  # every projection of every layer
    a, b = adapter.weights[(1, "down_proj")]
    assert (a.shape, b.shape) == ((4, 64), (32, 4))


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_adapter_is_refused_naming_what_is_wrong(
    case: str, malformed: dict[str, tuple[Path, str]], shapes: BaseShapes
) -> None:
    folder, words = malformed[case]
    with pytest.raises(ValueError, match=re.escape(words)) as refused:
        read_adapter(lora_request("bad", folder, 1), shapes, MAX_RANK, torch.float32)
    assert str(refused.value).startswith("LoRA adapter 'bad': ")


def test_a_refused_adapter_leaves_nothing_in_the_manager(
    good: Path, malformed: dict[str, tuple[Path, str]], shapes: BaseShapes
) -> None:
    manager = LoRAManager(LoRAConfig(max_loras=2, max_lora_rank=MAX_RANK), shapes, torch.float32)
    manager.check(lora_request("good", good, 1))
    for i, case in enumerate(MALFORMED, start=2):
        with pytest.raises(ValueError):
            manager.check(lora_request(case, malformed[case][0], i))
    assert manager.resident == ["good"]
    assert manager.stats.loads == 1
