"""Linear layers on a GGUF file's own blocks (csrc/gemm_gguf.cpp, MODELYARD_WEIGHTS=gguf): the
packed panels of every block type hold exactly the weights of gguf's own float32 dequantization,
the kernel computes x times them (float32 and bfloat16 inputs, decode and prompt row counts, gated
MLPs fused or not, mixed kinds side by side), embeddings gather dequantized rows, and the q/k row
order of llama.cpp's converter is undone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, quants
from gguf_random import TYPES, random_blocks

from modelyard.config_parse import ConfigError
from modelyard.engine.config import EngineConfig, LoRAConfig, kernels_from_environment
from modelyard.runner import kernels, model_runner
from modelyard.runner.gguf_weights import (
    Q4_1,
    Q8_0,
    Blocks,
    GGUFEmbedding,
    GGUFGatedMLP,
    GGUFLinear,
    GGUFSwiGLU,
    dequantize_blocks,
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


def blocks_of(weight: torch.Tensor, kind: int) -> tuple[Blocks, torch.Tensor]:
    """gguf's own quantization of `weight` and gguf's own float32 dequantization of it."""
    qtype = GGMLQuantizationType.Q4_1 if kind == Q4_1 else GGMLQuantizationType.Q8_0
    raw = quants.quantize(weight.numpy(), qtype)
    reference = torch.from_numpy(np.array(quants.dequantize(raw, qtype)))
    return Blocks(kind, raw, int(weight.shape[1])), reference


def random_weight(name: str, n: int, k: int, seed: int) -> tuple[Blocks, torch.Tensor]:
    blocks = random_blocks(name, n, k, seed)
    return blocks, dequantize_blocks(blocks)  # bit for bit gguf's (test_gguf_blocks)


@pytest.mark.parametrize("name", TYPES)
def test_panels_hold_the_gguf_dequantization_bit_for_bit(name: str) -> None:
    blocks, reference = random_weight(name, 37, 512, seed=5)
    packed = pack_gguf(blocks)
    per_unit = 256 if name in ("Q4_K", "Q6_K") else 32  # a K layout's unit: a super-block
    assert packed.shape[:2] == (3, 512 // per_unit)
    got = dequantize_gguf(packed, blocks.kind, 37)
    assert torch.equal(got.view(torch.int32), reference.view(torch.int32))


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_is_x_times_the_weights(name: str, dtype: torch.dtype) -> None:
    torch.manual_seed(7)
    n, k = 53, 512
    blocks, weight = random_weight(name, n, k, seed=n)
    bias = torch.randn(n)
    layer = GGUFLinear(blocks, bias)
    for rows in (1, 7, 9, 64, 100):
        x = torch.randn(rows, k).to(dtype)
        got = layer(x)
        want = F.linear(x.float(), weight, bias)
        assert got.dtype == dtype
        assert got.shape == (rows, n)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * want.abs().max())


def test_quantized_by_gguf_itself() -> None:
    for kind in (Q4_1, Q8_0):
        blocks, weight = blocks_of(torch.randn(40, 96) * 0.05, kind)
        x = torch.randn(3, 96)
        want = F.linear(x, weight)
        torch.testing.assert_close(GGUFLinear(blocks, None)(x), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("gate_type", "up_type", "act"),
    [
        ("Q4_K", "Q4_K", "silu"),  # fused
        ("Q4_1", "Q4_K", "silu"),  # fused: one layout
        ("Q6_K", "Q5_K", "silu"),
        ("Q5_0", "Q8_0", "gelu_tanh"),
        ("Q6_K", "Q6_K", "gelu_tanh"),
    ],
)
def test_gated_mlp_is_act_gate_times_up(gate_type: str, up_type: str, act: str) -> None:
    torch.manual_seed(3)
    gate, wg = random_weight(gate_type, 40, 256, seed=1)
    up, wu = random_weight(up_type, 40, 256, seed=2)
    mlp = GGUFGatedMLP(gate, up, "silu" if act == "silu" else "gelu_tanh")
    assert mlp.width == 40
    for rows, dtype in ((1, torch.float32), (9, torch.bfloat16), (67, torch.float32)):
        x = torch.randn(rows, 256)
        g = x @ wg.T
        want = (F.silu(g) if act == "silu" else F.gelu(g, approximate="tanh")) * (x @ wu.T)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        got = mlp(x.to(dtype)).float()
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * want.abs().max())


def test_swiglu_keeps_its_call() -> None:
    (gate, wg), (up, wu) = (blocks_of(torch.randn(40, 96) * 0.2, Q8_0) for _ in range(2))
    x = torch.randn(5, 96)
    want = F.silu(x @ wg.T) * (x @ wu.T)
    torch.testing.assert_close(GGUFSwiGLU(gate, up)(x), want, rtol=1e-5, atol=1e-5)


def test_of_parts_puts_mixed_kinds_side_by_side() -> None:
    torch.manual_seed(4)
    parts = [random_weight(t, n, 256, seed=n) for t, n in (("Q5_0", 24), ("Q5_0", 8), ("Q8_0", 8))]
    bias = torch.randn(40)
    qkv = GGUFLinear.of_parts([b for b, _ in parts], bias)
    weight = torch.cat([w for _, w in parts])
    for rows in (1, 70):
        x = torch.randn(rows, 256)
        want = F.linear(x, weight, bias)
        torch.testing.assert_close(qkv(x), want, rtol=1e-5, atol=1e-5 * want.abs().max())
    one = GGUFLinear.of_parts([parts[0][0], parts[1][0]], None)
    assert isinstance(one, GGUFLinear)
    assert one.out_features == 32


@pytest.mark.parametrize("name", ["Q8_0", "Q6_K"])
def test_embedding_rows_are_the_dequantized_rows(name: str) -> None:
    blocks, weight = random_weight(name, 50, 256, seed=9)
    embedding = GGUFEmbedding(blocks)
    ids = torch.tensor([3, 0, 49, 3])
    assert torch.equal(embedding(ids), weight[ids])
    assert embedding.blocks is blocks


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
        packed_linear_gguf(x, packed, 8, 16, None)
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
