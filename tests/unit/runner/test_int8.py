"""Weight-only int8 linear layers (csrc/gemm_int8.cpp, MODELYARD_WEIGHTS=int8): the kernel
computes x times the dequantized weight, for float32 and bfloat16 inputs, at decode and prompt
row counts, and the quantization error stays within half a step of each row's scale."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from modelyard.engine.config import kernels_from_environment
from modelyard.runner import kernels
from modelyard.runner.kernel_config import KernelConfig
from modelyard.runner.linear import Linear, SwiGLU

KERNELS = kernels_from_environment()  # the switches of this test run's environment

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not kernels.load(KERNELS), reason="the runner's kernels did not build here"),
]


def test_quantization_error_is_half_a_step_per_row() -> None:
    torch.manual_seed(0)
    weight = torch.randn(37, 200) * torch.linspace(0.01, 3, 37)[:, None]
    packed, scale = kernels.pack_int8(weight)
    assert packed.dtype == torch.int8
    assert packed.shape == (3, 200, 16)
    back = kernels.dequantize_int8(packed, scale, 37)
    step = scale[:37, None]
    assert bool(((back - weight).abs() <= step / 2 + 1e-6 * weight.abs()).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "k"), [(96, 576), (37, 40), (200, 1536)])
def test_int8_gemm_is_x_times_the_dequantized_weight(dtype: torch.dtype, n: int, k: int) -> None:
    torch.manual_seed(n + k)
    weight, bias = torch.randn(n, k) * 0.05, torch.randn(n)
    packed, scale = kernels.pack_int8(weight)
    dequantized = kernels.dequantize_int8(packed, scale, n)
    for rows in (1, 2, 7, 8, 9, 32, 64):
        x = torch.randn(rows, k).to(dtype)
        for b in (None, bias):
            out = kernels.packed_linear_int8(x, packed, scale, n, b)
            assert out.dtype == dtype
            expected = F.linear(x.float(), dequantized, b)
            if dtype == torch.float32:
                torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
            else:  # the float32 sum, rounded once to bf16
                torch.testing.assert_close(out, expected.bfloat16(), rtol=8e-3, atol=1e-3)


def test_int8_gemm_refuses_other_weights() -> None:
    x = torch.randn(3, 64)
    packed, scale = kernels.pack_int8(torch.randn(32, 64))
    with pytest.raises(RuntimeError, match="not from pack_int8"):
        kernels.packed_linear_int8(x, packed.float(), scale, 32, None)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        kernels.packed_linear_int8(x, packed, scale, 40, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layers_keep_int8_weights_when_asked(dtype: torch.dtype) -> None:
    """Linear and SwiGLU with MODELYARD_WEIGHTS=int8: the int8 kernel at decode sizes and the
    dequantized weight at prompt sizes give the same numbers (to the dtype's rounding)."""
    config = KernelConfig.from_env({"MODELYARD_WEIGHTS": "int8"})
    torch.manual_seed(3)
    weight, bias = (torch.randn(80, 576) * 0.05).to(dtype), torch.randn(80).to(dtype)
    gate, up = (torch.randn(48, 576) * 0.05).to(dtype), (torch.randn(48, 576) * 0.05).to(dtype)
    layer, mlp = (
        Linear(weight, bias, pack=True, kernel_config=config),
        SwiGLU(gate, up, pack=True, kernel_config=config),
    )
    assert layer._int8 is not None
    assert mlp._both is not None
    assert mlp._both._int8 is not None
    x = torch.randn(100, 576).to(dtype)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(layer(x[:5]), layer(x)[:5], **tol)
    torch.testing.assert_close(mlp(x[:5]), mlp(x)[:5], **tol)
    exact = F.linear(x.float(), weight.float(), bias.float())  # unquantized
    assert float((layer(x).float() - exact).abs().max()) < 0.05
