"""Linear layers on a GGUF file's own blocks (csrc/gemm_gguf.cpp, MODELYARD_WEIGHTS=gguf): the
packed panels hold exactly the weights of gguf's own float32 dequantization, the kernel computes
x times them (float32 and bfloat16 inputs, decode and prompt row counts, SwiGLU fused), and the
q/k row order of llama.cpp's converter is undone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, quants

from modelyard.config_parse import ConfigError
from modelyard.engine.config import EngineConfig, LoRAConfig, kernels_from_environment
from modelyard.runner import kernels, model_runner
from modelyard.runner.gguf_weights import (
    DECODE_ROWS,
    Q4_1,
    Q8_0,
    Blocks,
    GGUFLinear,
    GGUFSwiGLU,
    dequantize_gguf,
    pack_gguf,
    packed_linear_gguf,
    unpermute_rows,
)
from modelyard.runner.kernel_config import KernelConfig
from modelyard.runner.loader import ResolvedModel

KERNELS = kernels_from_environment()  # the switches of this test run's environment

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not kernels.load(KERNELS), reason="the runner's kernels did not build here"),
]

TYPES = {Q4_1: GGMLQuantizationType.Q4_1, Q8_0: GGMLQuantizationType.Q8_0}


def blocks_of(weight: torch.Tensor, kind: int) -> tuple[Blocks, torch.Tensor]:
    """gguf's own quantization of `weight` and gguf's own float32 dequantization of it."""
    raw = quants.quantize(weight.numpy(), TYPES[kind])
    reference = torch.from_numpy(np.array(quants.dequantize(raw, TYPES[kind])))
    return Blocks(kind, raw, int(weight.shape[1])), reference


@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
@pytest.mark.parametrize(("n", "k"), [(37, 64), (96, 576), (200, 1536)])
def test_panels_hold_the_gguf_dequantization_bit_for_bit(kind: int, n: int, k: int) -> None:
    torch.manual_seed(n + k)
    blocks, reference = blocks_of(torch.randn(n, k) * 0.05, kind)
    packed = pack_gguf(blocks)
    assert packed.shape[:2] == ((n + 15) // 16, k // 32)
    assert torch.equal(dequantize_gguf(packed, kind, n), reference)


@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_is_x_times_the_weights(kind: int, dtype: torch.dtype) -> None:
    torch.manual_seed(kind)
    n, k = 53, 576
    blocks, weight = blocks_of(torch.randn(n, k) * 0.05, kind)
    bias = torch.randn(n)
    layer = GGUFLinear(blocks, bias)
    for rows in (1, 2, 7, 8, 9, 32, DECODE_ROWS, DECODE_ROWS + 1, 130):
        x = torch.randn(rows, k).to(dtype)
        got = layer(x)
        want = F.linear(x.float(), weight, bias)
        assert got.dtype == dtype
        assert got.shape == (rows, n)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * want.abs().max())


@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
def test_swiglu_is_silu_gate_times_up(kind: int) -> None:
    torch.manual_seed(3)
    (gate, wg), (up, wu) = (blocks_of(torch.randn(40, 96) * 0.2, kind) for _ in range(2))
    mlp = GGUFSwiGLU(gate, up)
    assert mlp.width == 40
    for rows in (1, 8, 9, 33, DECODE_ROWS, DECODE_ROWS + 3):
        x = torch.randn(rows, 96)
        want = F.silu(x @ wg.T) * (x @ wu.T)
        torch.testing.assert_close(mlp(x), want, rtol=1e-5, atol=1e-5 * want.abs().max())


def test_unpermute_rows_undoes_the_converters_rotary_permutation() -> None:
    heads, head_dim, k = 3, 8, 5
    weight = torch.randn(heads * head_dim, k)
    # llama.cpp's convert_hf_to_gguf.py permute(): each head's two rotary halves interleaved
    stored = weight.reshape(heads, 2, head_dim // 2, k).swapaxes(1, 2).reshape(heads * head_dim, k)
    order = torch.from_numpy(unpermute_rows(heads * head_dim, heads))
    assert torch.equal(stored[order], weight)


def test_a_wrong_kind_or_shape_is_refused() -> None:
    blocks, _ = blocks_of(torch.randn(16, 64), Q4_1)
    packed = pack_gguf(blocks)
    x = torch.randn(1, 64)
    with pytest.raises(RuntimeError, match="not from pack_gguf"):
        packed_linear_gguf(x, packed, Q8_0, 16, None)
    with pytest.raises(RuntimeError, match="kind 0"):
        packed_linear_gguf(x, packed, 7, 16, None)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        packed_linear_gguf(x, packed, Q4_1, 17, None)
    with pytest.raises(RuntimeError, match="K = 32"):
        packed_linear_gguf(torch.randn(1, 32), packed, Q4_1, 16, None)


@pytest.mark.parametrize(
    ("env", "switch", "used"),
    [("", "auto", True), ("int8", "auto", False), ("int8", "on", True), ("gguf", "off", False)],
)
def test_the_catalog_switch_and_the_environment_choose_the_blocks(
    env: str, switch: str, used: bool
) -> None:
    config = KernelConfig.from_env({"MODELYARD_WEIGHTS": env})
    gguf = ResolvedModel(
        "m.gguf", Path("folder"), "LlamaForCausalLM", None, Path("t"), Path("m.gguf")
    )
    expected = Path("m.gguf") if used else None
    assert model_runner._gguf_source(gguf, switch, config, None) == expected
    lora = LoRAConfig()
    assert model_runner._gguf_source(gguf, switch, config, lora) == (
        expected if switch == "on" else None
    )
    folder = ResolvedModel("folder", Path("folder"), "LlamaForCausalLM", None, Path("t"), None)
    assert model_runner._gguf_source(folder, switch, config, None) is None


def test_gguf_blocks_is_a_checked_engine_option() -> None:
    on = EngineConfig.from_options("m.gguf", {"gguf_blocks": True})  # YAML's `on`
    assert on.model.gguf_blocks == "on"
    assert EngineConfig.from_options("m.gguf", {}).model.gguf_blocks == "auto"
    with pytest.raises(ConfigError, match="gguf_blocks"):
        EngineConfig.from_options("m.gguf", {"gguf_blocks": "maybe"})
