"""GGUF blocks times int8 activations (csrc/gguf_dot.h, MODELYARD_GGUF_DOT=q8): the kernel computes
exactly the weights times x rounded to int8 per 32 inputs (the reference rounds x the same way
in torch), every row alike whatever the row count, near x times the weights, and the kinds
without dot products (Q5_*, Q8_0) keep their float32 products."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gguf_random import random_blocks

from modelyard.engine.config import kernels_from_environment
from modelyard.runner import kernels
from modelyard.runner.gguf_weights import (
    DOT_FLOAT,
    DOT_Q8,
    GGUFGatedMLP,
    GGUFLinear,
    dequantize_blocks,
    dot_of,
)
from modelyard.runner.kernel_config import KernelConfig

KERNELS = kernels_from_environment()
DOT_KINDS = ("Q4_0", "Q4_1", "Q4_K", "Q6_K")

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not kernels.load(KERNELS), reason="the runner's kernels did not build here"),
]


def rounded(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel sees it: per 32 inputs dx q8, dx = max |x| / 127, q8 = round(x 127 / max)."""
    blocks = x.float().reshape(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros_like(amax))
    q8 = torch.round(blocks * inv).clamp(-127, 127)
    return (q8.double() * (amax.double() / 127)).reshape(x.shape)


def expected(x: torch.Tensor, weight: torch.Tensor, dotted: bool) -> torch.Tensor:
    """x W^T in float64: with x rounded where the build has the dot products (AVX2 and up)."""
    xs = rounded(x) if dotted and KERNELS.has("avx2") else x.double()
    return xs @ weight.double().T


@pytest.mark.parametrize("name", [*DOT_KINDS, "Q5_K", "Q8_0"])
def test_q8_products_are_the_weights_times_rounded_x(name: str) -> None:
    torch.manual_seed(5)
    blocks = random_blocks(name, 37, 512, seed=11)
    weight = dequantize_blocks(blocks)
    layer = GGUFLinear(blocks, None, DOT_Q8)
    for rows in (1, 6, 70):
        x = torch.randn(rows, 512) * torch.rand(rows, 1) * 4
        got = layer(x).double()
        want = expected(x, weight, name in DOT_KINDS)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
        exact = x.double() @ weight.double().T  # and near the float32 product
        assert float((got - exact).abs().max()) <= 2e-2 * float(exact.abs().max())


@pytest.mark.parametrize("name", DOT_KINDS)
def test_each_row_is_the_same_at_any_row_count(name: str) -> None:
    blocks = random_blocks(name, 40, 256, seed=3)
    layer = GGUFLinear(blocks, None, DOT_Q8)
    x = torch.randn(9, 256)
    together = layer(x)
    for i in (0, 4, 8):
        assert torch.equal(layer(x[i : i + 1]), together[i : i + 1])


def test_fused_swiglu_takes_the_rounded_rows_too() -> None:
    gate, up = random_blocks("Q4_K", 48, 256, seed=1), random_blocks("Q4_K", 48, 256, seed=2)
    wg, wu = dequantize_blocks(gate), dequantize_blocks(up)
    mlp = GGUFGatedMLP(gate, up, "silu", DOT_Q8)
    for rows in (1, 5):
        x = torch.randn(rows, 256)
        want = F.silu(expected(x, wg, True)) * expected(x, wu, True)
        got = mlp(x).double()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


def test_the_config_chooses_the_products() -> None:
    q8 = KernelConfig.from_env({})
    assert q8.gguf_dot == "q8"
    assert dot_of(q8) == DOT_Q8
    assert dot_of(KernelConfig.from_env({"MODELYARD_GGUF_DOT": "float"})) == DOT_FLOAT
    with pytest.raises(ValueError, match="MODELYARD_GGUF_DOT"):
        KernelConfig.from_env({"MODELYARD_GGUF_DOT": "int4"})
