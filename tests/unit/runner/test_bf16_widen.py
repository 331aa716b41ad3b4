"""bf16 linear layers where the kernels have no AVX-512 (runner.bf16_widen, csrc/gemm_int8.cpp
and csrc/gemm.cpp): the weights widened to float32 and summed in float32 give x W^T within
bf16's rounding at every row count, more than one row exactly the float32 GEMM's bits on the
widened weight, and bf16 layers take this path exactly where it is meant to run."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from modelyard.engine.config import kernels_from_environment
from modelyard.runner import bf16_widen, kernels
from modelyard.runner.kernel_config import KernelConfig
from modelyard.runner.linear import Linear, SwiGLU

KERNELS = kernels_from_environment()  # the switches of this test run's environment

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not kernels.load(KERNELS), reason="the runner's kernels did not build here"),
]


def assert_within_bf16(
    y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None
) -> None:
    """y is x W^T (+ b) to bf16's rounding (half a step of 2^-8) plus float32 summation error."""
    ref = x.double() @ w.double().T + (0 if b is None else b.double())
    scale = x.double().abs() @ w.double().abs().T + (0 if b is None else b.double().abs())
    err = (y.double() - ref).abs()
    assert y.dtype == torch.bfloat16
    assert bool((err <= ref.abs() * 2**-8 + 1e-5 * scale).all()), float(
        (err - ref.abs() * 2**-8).max()
    )


@pytest.mark.parametrize(("n", "k"), [(37, 40), (200, 576), (64, 1536)])
def test_panels_hold_the_weight(n: int, k: int) -> None:
    weight = torch.randn(n, k).bfloat16()
    packed = bf16_widen.pack(weight)
    assert packed.shape == ((n + 15) // 16, k, 16)
    assert torch.equal(bf16_widen.unpack(packed, n), weight)
    assert not bool(packed.transpose(1, 2).reshape(-1, k)[n:].any())  # zero padding


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize(("n", "k"), [(37, 40), (200, 576), (64, 1536), (96, 576)])
def test_widened_gemm_is_x_times_w_at_every_row_count(n: int, k: int, with_bias: bool) -> None:
    torch.manual_seed(n * k)
    weight = (torch.randn(n, k) * 0.05).bfloat16()
    bias = torch.randn(n) if with_bias else None
    packed = bf16_widen.pack(weight)
    # 1: four streams a unit; more: micro-kernel calls of up to 6 rows (12 where the kernels
    # have AVX-512), blocks of 96 rows
    for rows in (1, 2, 5, 6, 7, 13, 32, 64, 65, 96, 97, 130, 200):
        x = torch.randn(rows, k).bfloat16()
        assert_within_bf16(bf16_widen.linear(x, packed, n, bias), x, weight, bias)


SHAPES = [(37, 40), (37, 41), (50, 333), (200, 576), (64, 1536)]  # odd K: odd chunks


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_rows_are_the_float32_gemm_on_the_widened_weight(n: int, k: int, with_bias: bool) -> None:
    """The kernel's sums are the float32 GEMM's on the float32 weight, in its K chunks and
    order: past one row it runs that GEMM's micro-kernels over chunks widened once, one row
    sums the same chunks in registers. So the same bits once rounded."""
    torch.manual_seed(n + k)
    ops = torch.ops.modelyard_kernels
    weight = (torch.randn(n, k) * 0.05).bfloat16()
    bias = torch.randn(n) if with_bias else None
    packed, packed32 = bf16_widen.pack(weight), ops.pack_weight(weight.float())
    for rows in (1, 2, 7, 32, 97):
        x = torch.randn(rows, k).bfloat16()
        want = ops.packed_linear(x.float(), packed32, n, bias).to(torch.bfloat16)
        assert torch.equal(bf16_widen.linear(x, packed, n, bias), want), rows


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(n: int, k: int) -> None:
    """A request decoding alone (one row: the one-row kernel) gets the bits it gets in a batch
    (the widened GEMM)."""
    torch.manual_seed(n * k + 1)
    packed = bf16_widen.pack((torch.randn(n, k) * 0.05).bfloat16())
    x = torch.randn(9, k).bfloat16()
    batch = bf16_widen.linear(x, packed, n, None)
    for r in range(9):
        assert torch.equal(bf16_widen.linear(x[r : r + 1], packed, n, None), batch[r : r + 1])


@pytest.mark.parametrize("rows", [1, 3])
def test_non_finite_inputs_stay_non_finite(rows: int) -> None:
    weight = torch.ones(16, 8).bfloat16()
    x = torch.ones(rows, 8).bfloat16()
    x[:, 3] = float("inf")
    x[rows - 1, 5] = float("nan")
    y = bf16_widen.linear(x, bf16_widen.pack(weight), 16, None)
    assert bool(torch.isinf(y[: rows - 1]).all())
    assert bool(torch.isnan(y[rows - 1]).all())


def _config(**kw: str) -> KernelConfig:
    return dataclasses.replace(KernelConfig.from_env(kw), isa="avx2")


def test_bf16_layers_take_the_path_on_hosts_without_avx512() -> None:
    config = _config()
    assert bf16_widen.available(config)
    torch.manual_seed(5)
    weight, bias = (torch.randn(80, 576) * 0.05).bfloat16(), torch.randn(80).bfloat16()
    gate, up = ((torch.randn(48, 576) * 0.05).bfloat16() for _ in range(2))
    layer, mlp = (
        Linear(weight, bias, pack=True, kernel_config=config),
        SwiGLU(gate, up, pack=True, kernel_config=config),
    )
    assert layer._widen is not None
    x = torch.randn(100, 576).bfloat16()
    for rows in (1, 32, 100):
        assert_within_bf16(layer(x[:rows]), x[:rows], weight, bias.float())
    both = torch.cat([gate, up]).float()
    g, u = (x.float() @ both.T).chunk(2, dim=-1)
    torch.testing.assert_close(
        mlp(x).float(), torch.nn.functional.silu(g) * u, rtol=2e-2, atol=2e-2
    )


def test_switches_keep_torchs_bf16() -> None:
    assert not bf16_widen.available(_config(MODELYARD_BF16_GEMM="onednn"))
    default = KernelConfig.from_env({})
    assert bf16_widen.available(default) == (not default.has("avx512"))
