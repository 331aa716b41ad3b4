"""The runner's AMX tile GEMM (csrc/gemm_amx.cpp): oneDNN's bits at decode row counts on AMX
hosts, SwiGLU fused likewise, and the layers' choice of kernel by row count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from modelyard.engine.config import kernels_from_environment
from modelyard.runner import kernels
from modelyard.runner.linear import Linear, SwiGLU

KERNELS = kernels_from_environment()  # the switches of this test run's environment

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(
        not kernels.amx_ready(), reason="kernels without AMX tiles here (or the OS refused them)"
    ),
]


@pytest.mark.parametrize(
    ("out_features", "in_features"),
    [(960, 576), (37, 64), (576, 1536), (50, 3072), (40, 4096), (33, 96)],
)
def test_amx_gemm_gives_f_linears_bits_at_decode_rows(out_features: int, in_features: int) -> None:
    """Every row count 1-32 (row blocks of 16 and the ragged last), ragged output widths and an
    odd panel count: oneDNN's AMX kernels sum each output over k in order, as the tiles do."""
    torch.manual_seed(in_features + out_features)
    weight = (torch.randn(out_features, in_features) * 0.05).bfloat16()
    packed = kernels.pack_bf16(weight)
    for rows in range(1, kernels.AMX_ROWS + 1):
        x = torch.randn(rows, in_features).bfloat16()
        out = kernels.packed_linear_amx(x, packed, out_features)
        torch.testing.assert_close(out, F.linear(x, weight), rtol=0, atol=0)


def test_amx_gemm_past_32_rows_is_close() -> None:
    """Past 32 rows the kernel still computes the product (row blocks over the same panels);
    oneDNN sums otherwise there, so only closeness is asked (the layers keep oneDNN)."""
    torch.manual_seed(0)
    weight = (torch.randn(200, 576) * 0.05).bfloat16()
    x = torch.randn(75, 576).bfloat16()
    out = kernels.packed_linear_amx(x, kernels.pack_bf16(weight), 200)
    exact = x.double() @ weight.double().t()
    torch.testing.assert_close(out.double(), exact, rtol=1e-2, atol=1e-2)


def test_amx_gemm_keeps_its_bits_across_calls_of_other_shapes_and_threads() -> None:
    """Each thread configures the tiles once per call (for its row count) and releases them
    after its last unit: calls of changing row counts, beside the AVX-512/float32 kernels and
    on the decode step's helper thread, each still give oneDNN's bits."""
    torch.manual_seed(5)
    weight = (torch.randn(960, 576) * 0.05).bfloat16()
    packed = kernels.pack_bf16(weight)
    other = kernels.pack_weight(torch.randn(64, 576))
    for team in (False, True):
        with kernels.team(team):
            for rows in (32, 1, 17, 75, 16, 3, 32):
                x = torch.randn(rows, 576).bfloat16()
                out = kernels.packed_linear_amx(x, packed, 960)
                kernels.packed_linear(x.float(), other, 64, None)  # no tiles in between
                if rows <= kernels.AMX_ROWS:
                    torch.testing.assert_close(out, F.linear(x, weight), rtol=0, atol=0)


@pytest.mark.parametrize(("width", "in_features"), [(1536, 576), (40, 64), (100, 1536)])
def test_amx_swiglu_gives_torchs_bits(width: int, in_features: int) -> None:
    torch.manual_seed(width)
    gate = (torch.randn(width, in_features) * 0.3).bfloat16()
    up = torch.randn(width, in_features).bfloat16()
    packed = kernels.pack_swiglu_bf16(gate, up)
    for rows in (1, 2, 15, 16, 17, 31, 32):
        x = (torch.randn(rows, in_features) * 2).bfloat16()
        expected = F.silu(F.linear(x, gate)) * F.linear(x, up)
        out = kernels.packed_swiglu_amx(x, packed, width)
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-30)


def test_layers_run_amx_up_to_32_rows_and_onednn_past_them() -> None:
    """Linear and SwiGLU pick the AMX kernel at decode sizes; a prompt's rows go to oneDNN: the
    results are F.linear's bits either way."""
    if kernels.bf16_gemm_path(KERNELS.bf16_gemm) != "amx":
        pytest.skip("oneDNN's AMX order not found here: the layers keep oneDNN")
    torch.manual_seed(1)
    weight = (torch.randn(96, 576) * 0.05).bfloat16()
    gate, up = (torch.randn(64, 576) * 0.05).bfloat16(), torch.randn(64, 576).bfloat16()
    layer, mlp = (
        Linear(weight, None, pack=True, kernel_config=KERNELS),
        SwiGLU(gate, up, pack=True, kernel_config=KERNELS),
    )
    assert layer._gemm is not None
    assert layer._gemm[0] is kernels.packed_linear_amx
    assert mlp._gemm is not None
    assert mlp._gemm[0] is kernels.packed_swiglu_amx
    for rows in (1, 32, 33, 300):
        x = torch.randn(rows, 576).bfloat16()
        torch.testing.assert_close(layer(x), F.linear(x, weight), rtol=0, atol=0)
        expected = F.silu(F.linear(x, gate)) * F.linear(x, up)
        torch.testing.assert_close(mlp(x), expected, rtol=0, atol=1e-30)


def test_amx_gemm_refuses_bad_inputs() -> None:
    weight, x = torch.randn(64, 96).bfloat16(), torch.randn(3, 96).bfloat16()
    plain, swiglu = kernels.pack_bf16(weight), kernels.pack_swiglu_bf16(weight, weight)
    with pytest.raises(RuntimeError, match="not from pack_swiglu_bf16"):
        kernels.packed_swiglu_amx(x, plain, 32)
    with pytest.raises(RuntimeError, match="not from pack_bf16"):
        kernels.packed_linear_amx(x, swiglu, 64)
    odd = torch.randn(64, 40).bfloat16()
    with pytest.raises(RuntimeError, match="multiple of 32"):
        kernels.packed_linear_amx(torch.randn(3, 40).bfloat16(), kernels.pack_bf16(odd), 64)


def test_amx_epilogues_written_during_the_next_unit_stay_per_call() -> None:
    """Up to 32 rows each unit's epilogue is written during the thread's next unit and the last
    one before the call returns: alternating linear and SwiGLU calls of other shapes, with and
    without the helper thread, each give the torch ops' bits."""
    torch.manual_seed(8)
    weight = (torch.randn(200, 576) * 0.05).bfloat16()
    gate, up = ((torch.randn(96, 576) * 0.05).bfloat16() for _ in range(2))
    packed, both = kernels.pack_bf16(weight), kernels.pack_swiglu_bf16(gate, up)
    for team in (False, True):
        with kernels.team(team):
            for rows in (32, 5, 1, 32, 17):
                x = torch.randn(rows, 576).bfloat16()
                linear = kernels.packed_linear_amx(x, packed, 200)
                swiglu = kernels.packed_swiglu_amx(x, both, 96)
                torch.testing.assert_close(linear, F.linear(x, weight), rtol=0, atol=0)
                expected = F.silu(F.linear(x, gate)) * F.linear(x, up)
                torch.testing.assert_close(swiglu, expected, rtol=0, atol=0)
