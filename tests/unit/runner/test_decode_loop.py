"""The compiled layer loop (runner.decode_loop / csrc/decode_loop.cpp) against the Python loop it
replaces: the same logits and KV caches bit for bit, on the steps it covers, and no loop where a
layer runs anything else."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from modelyard.engine.config import kernels_from_environment
from modelyard.runner import kernels
from modelyard.runner.attention import AttentionMetadata
from modelyard.runner.decode_loop import GEMM_KINDS, DecodeLoop
from modelyard.runner.models.decoder import DecoderModel
from modelyard.runner.spec_decode.draft import self_draft_model
from modelyard.runner.weights import SafetensorsSource

KERNELS = kernels_from_environment()  # the switches of this test run's environment

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _built() -> None:
    assert kernels.load(KERNELS), "the native kernels did not build (see scripts/setup)"


def _model(folder: Path, dtype: torch.dtype) -> DecoderModel:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    return DecoderModel(
        SafetensorsSource(folder),
        config.architectures[0],
        config,
        dtype=dtype,
        num_blocks=12,
        block_size=4,
        max_model_len=64,
        kernel_config=KERNELS,
    )


def _expected_kind(dtype: torch.dtype) -> int | None:
    if dtype == torch.float32:
        return GEMM_KINDS["float32"]
    path = kernels.bf16_gemm_path(
        KERNELS.bf16_gemm
    )  # bf16 runs the runner's GEMM only on these paths
    return None if path is None else GEMM_KINDS[path]


def _steps() -> list[tuple[torch.Tensor, AttentionMetadata, torch.Tensor]]:
    """A prompt, a mixed step (a decode and a second prompt) and a decode of both requests."""
    first, second = torch.tensor([5, 9, 2, 33, 8, 1, 7]), torch.tensor([4, 40, 3, 19, 61])
    tables = [[3, 1, 9], [7, 5]]
    return [
        (first, AttentionMetadata.build([0], [7], [tables[0]], 4), torch.tensor([6])),
        (
            torch.cat([torch.tensor([11]), second]),
            AttentionMetadata.build([7, 0], [1, 5], tables, 4),
            torch.tensor([0, 5]),
        ),
        (
            torch.tensor([12, 13]),
            AttentionMetadata.build([8, 5], [1, 1], tables, 4),
            torch.arange(2),
        ),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loop_gives_the_python_loops_bits(
    tiny_models: dict[str, Path], dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    looped, plain = _model(tiny_models["llama"], dtype), _model(tiny_models["llama"], dtype)
    kind = _expected_kind(dtype)
    if kind is None:
        assert looped.loop is None
        pytest.skip("bf16 layers run oneDNN or widened float32 here: no compiled loop")
    assert looped.loop is not None
    assert looped.loop.gemm == kind
    plain.loop = None
    ran: list[int] = []
    run = DecodeLoop.run

    def counted(self: DecodeLoop, *args: torch.Tensor | AttentionMetadata) -> None:
        ran.append(args[0].shape[0])  # type: ignore[union-attr]
        run(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(DecodeLoop, "run", counted)
    with torch.inference_mode():
        for ids, meta, rows in _steps():
            logits = [m.forward(ids, meta, rows) for m in (looped, plain)]
            torch.testing.assert_close(logits[0], logits[1], atol=0, rtol=0)
    assert ran == [7, 6, 2]  # every step went through the compiled loop, none through plain's
    for a, b in zip(looped.k_cache + looped.v_cache, plain.k_cache + plain.v_cache, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_no_loop_for_layers_with_biases(tiny_models: dict[str, Path]) -> None:
    """Qwen2's q/k/v biases: its layers stay on the Python loop."""
    assert _model(tiny_models["qwen2"], torch.float32).loop is None


def test_a_self_draft_view_loops_over_its_own_layers(tiny_models: dict[str, Path]) -> None:
    target = _model(tiny_models["llama"], torch.float32)
    draft = self_draft_model(target, 1)
    assert target.loop is not None
    assert draft.loop is not None
    assert len(target.loop.weights) == 4 * len(target.layers) == 8
    assert len(draft.loop.weights) == 4
    assert len(draft.loop.k_caches) == 1
    assert draft.loop.k_caches[0] is target.k_cache[0]


def test_steps_past_the_gemms_rows_take_the_python_loop(tiny_models: dict[str, Path]) -> None:
    model = _model(tiny_models["llama"], torch.float32)
    assert model.loop is not None
    meta = AttentionMetadata.build([0], [7], [[3, 1]], 4)
    assert model.loop.covers(meta, 7, torch.float32)
    object.__setattr__(model.loop, "max_rows", 6)
    assert not model.loop.covers(meta, 7, torch.float32)
