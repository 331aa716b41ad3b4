"""runner.lora.manager on hand-written PEFT files (no model): per-row deltas equal s * B A x for
each row's own adapter and exactly 0 for base rows, the compiled kernels' and the torch path's
alike; slots and the loaded-adapter cache evict the least recently used; adapters that do not
fit are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from modelyard.engine.config import LoRAConfig, kernels_from_environment
from modelyard.engine.messages import LoRARequest
from modelyard.runner import kernels
from modelyard.runner.lora.adapter import BaseShapes
from modelyard.runner.lora.manager import LoRAManager

KERNELS = kernels_from_environment()  # the switches of this test run's environment

pytestmark = pytest.mark.unit

SHAPES = BaseShapes(
    num_layers=2,
    modules={
        "q_proj": (8, 8),
        "k_proj": (8, 4),
        "v_proj": (8, 4),
        "o_proj": (8, 8),
        "gate_proj": (8, 12),
        "up_proj": (8, 12),
        "down_proj": (12, 8),
    },
)


def write_adapter(
    folder: Path,
    seed: int,
    rank: int = 2,
    modules: tuple[str, ...] = ("q_proj", "v_proj"),
    **config: object,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(SHAPES.num_layers):
        for module in modules:
            size_in, size_out = SHAPES.modules[module]
            part = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            key = f"base_model.model.model.layers.{layer}.{part}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, size_in, generator=g)
            tensors[f"{key}.lora_B.weight"] = torch.randn(size_out, rank, generator=g)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    settings = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, **config}
    (folder / "adapter_config.json").write_text(json.dumps(settings))
    return folder


def lora(name: str, path: Path, adapter_id: int = 1) -> LoRARequest:
    return LoRARequest(name=name, path=str(path), adapter_id=adapter_id)


def manager(**config: int) -> LoRAManager:
    values = {"max_loras": 2, "max_lora_rank": 4, "max_cpu_loras": 4, **config}
    return LoRAManager(LoRAConfig(**values), SHAPES, torch.float32)


def expected_delta(path: Path, x: torch.Tensor, layer: int, module: str) -> torch.Tensor:
    from safetensors.torch import load_file

    tensors = load_file(str(path / "adapter_model.safetensors"))
    config = json.loads((path / "adapter_config.json").read_text())
    key = f"base_model.model.model.layers.{layer}.self_attn.{module}"
    a, b = tensors[f"{key}.lora_A.weight"], tensors[f"{key}.lora_B.weight"]
    return config["lora_alpha"] / config["r"] * (x @ a.T @ b.T)


def test_each_row_gets_its_own_adapters_delta_and_base_rows_get_zero(tmp_path: Path) -> None:
    one, two = write_adapter(tmp_path / "one", 1), write_adapter(tmp_path / "two", 2)
    m = manager()
    x = torch.randn(5, 8)
    rows = [(lora("one", one), 2), (None, 1), (lora("two", two), 2)]
    with m.step(rows):
        y = torch.zeros(5, 16)  # qkv: q 8 | k 4 | v 4
        m.add_delta(y, x, 1, "qkv")
        o = torch.zeros(5, 8)
        m.add_delta(o, x, 1, "o")  # no adapter touches o: nothing added
    assert torch.allclose(y[:2, :8], expected_delta(one, x[:2], 1, "q_proj"), atol=1e-5)
    assert torch.allclose(y[3:, 12:], expected_delta(two, x[3:], 1, "v_proj"), atol=1e-5)
    assert torch.equal(y[2], torch.zeros(16))  # the base row
    assert torch.equal(y[:, 8:12], torch.zeros(5, 4))  # k_proj is not targeted
    assert torch.equal(o, torch.zeros(5, 8))
    outside = torch.zeros(5, 16)
    m.add_delta(outside, x, 1, "qkv")  # outside a step: nothing
    assert torch.equal(outside, torch.zeros(5, 16))


@pytest.mark.skipif(not kernels.load(KERNELS), reason="compiled kernels not built")
def test_the_kernels_give_the_torch_paths_deltas_and_swiglu(tmp_path: Path) -> None:
    modules = tuple(SHAPES.modules)
    paths = [write_adapter(tmp_path / n, i, modules=modules) for i, n in enumerate("ab")]
    m = manager()
    x, h = torch.randn(6, 8), torch.randn(6, 12)
    rows = [(lora("a", paths[0]), 2), (None, 1), (lora("b", paths[1]), 3)]
    gate, up = torch.randn(12, 8), torch.randn(12, 8)
    packed = kernels.pack_swiglu(gate, up)  # 16 gate columns, 16 up columns (12 + padding)
    out = {}
    for kernel in (True, False):
        m.kernel = kernel
        with m.step(rows):
            ys = [torch.randn(6, w, generator=torch.Generator().manual_seed(w)) for w in (16, 8)]
            m.add_delta(ys[0], x, 0, "qkv")
            m.add_delta(ys[1], h, 1, "down")
            both = torch.cat([x @ gate.T, x @ up.T], 1)
            m.add_delta(both, x, 1, "gate_up")
            act = F.silu(both[:, :12]) * both[:, 12:]
            if kernel:
                fused = m.swiglu(kernels.packed_linear(x, packed, 32, None), x, 1, 12)
                assert torch.allclose(fused, act, atol=1e-5)
            out[kernel] = [*ys, act]
    for with_kernel, with_torch in zip(out[True], out[False], strict=True):
        assert torch.allclose(with_kernel, with_torch, atol=1e-5)


def test_slots_and_loaded_adapters_evict_the_least_recently_used(tmp_path: Path) -> None:
    paths = {n: write_adapter(tmp_path / n, i) for i, n in enumerate("abc")}
    m = manager(max_loras=2, max_cpu_loras=2)
    x = torch.randn(1, 8)
    for name in ("a", "b", "a", "c"):  # c takes b's slot (a was used more recently)
        with m.step([(lora(name, paths[name]), 1)]):
            y = torch.zeros(1, 16)
            m.add_delta(y, x, 0, "qkv")
        assert torch.allclose(y[:, :8], expected_delta(paths[name], x, 0, "q_proj"), atol=1e-5)
    assert m.resident == ["a", "c"]  # b was dropped from memory: two at most
    assert m.stats.loads == 3
    with m.step([(lora("b", paths["b"]), 1)]):
        pass
    assert m.stats.loads == 4  # read from disk again
    assert m.resident_bytes > 0
    m.drop(["b"])
    assert "b" not in m.resident


def test_the_byte_budget_keeps_only_what_fits(tmp_path: Path) -> None:
    a, b = write_adapter(tmp_path / "a", 1), write_adapter(tmp_path / "b", 2)
    m = manager(max_cpu_lora_bytes=1)  # smaller than any adapter: the newest one stays
    m.check(lora("a", a))
    m.check(lora("b", b))
    assert m.resident == ["b"]


def test_a_step_with_more_adapters_than_slots_is_refused(tmp_path: Path) -> None:
    paths = [write_adapter(tmp_path / n, i) for i, n in enumerate("abc")]
    m = manager(max_loras=2)
    rows = [(lora(p.name, p), 1) for p in paths]
    with pytest.raises(RuntimeError, match="max_loras"), m.step(rows):
        pass


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: write_adapter(d, 1, rank=8), "max_lora_rank"),
        (lambda d: write_adapter(d, 1, use_dora=True), "plain LoRA"),
        (lambda d: write_adapter(d, 1, bias="all"), "biases"),
        (lambda d: d, "adapter_config.json"),
    ],
)
def test_adapters_that_do_not_fit_are_refused(tmp_path: Path, make: object, message: str) -> None:
    folder = make(tmp_path / "x")  # type: ignore[operator]
    Path(folder).mkdir(exist_ok=True)
    with pytest.raises(ValueError, match=message):
        manager().check(lora("x", Path(folder)))


def test_a_tensor_that_does_not_fit_the_base_is_refused(tmp_path: Path) -> None:
    folder = write_adapter(tmp_path / "x", 1)
    tensors = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(2, 9)}
    tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"] = torch.zeros(8, 2)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    with pytest.raises(ValueError, match="does not fit the base"):
        manager().check(lora("x", folder))
