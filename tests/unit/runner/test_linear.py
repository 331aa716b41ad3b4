"""The runner's Linear and SwiGLU: float32 weights packed for the runner's GEMM give the torch
result (up to summation order), at decode and prefill row counts, ragged output widths, with and
without bias; bfloat16 weights packed by oneDNN give F.linear's bits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from modelyard.engine.config import kernels_from_environment
from modelyard.runner import bf16_widen
from modelyard.runner.kernel_config import KernelConfig
from modelyard.runner.linear import Linear, SwiGLU, packing_available

KERNELS = kernels_from_environment()  # the switches of this test run's environment

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("rows", [1, 5, 7, 32, 97, 300])  # micro-kernel and cache-block edges
@pytest.mark.parametrize("with_bias", [False, True])
# in_features 43: k past the last 8 (the rows' packing copies it element by element)
@pytest.mark.parametrize(
    ("out_features", "in_features"), [(96, 40), (37, 600), (149, 600), (53, 43)]
)
def test_packed_linear_matches_f_linear(
    rows: int, with_bias: bool, out_features: int, in_features: int
) -> None:
    assert packing_available(torch.float32, KERNELS), (
        "the runner's kernels are expected to build here"
    )
    torch.manual_seed(rows)
    weight, x = torch.randn(out_features, in_features), torch.randn(rows, in_features)
    bias = torch.randn(out_features) if with_bias else None
    layer = Linear(weight, bias, pack=True, kernel_config=KERNELS)
    torch.testing.assert_close(layer(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-4)
    assert layer.out_features == out_features
    # a non-contiguous input (a transposed view) gives the same result
    torch.testing.assert_close(layer(x.t().contiguous().t()), layer(x), rtol=0, atol=0)


@pytest.mark.parametrize(("out_features", "in_features"), [(112, 72), (149, 600), (3072, 576)])
def test_a_single_row_gives_its_bits_in_a_batch(out_features: int, in_features: int) -> None:
    """One row streams four panels at once with its own prefetch; every output still sums its k
    in order, so a row alone and the same row among others give the same bits (block counts
    with a remainder of three, two and none after the groups of four)."""
    torch.manual_seed(out_features)
    weight, x = torch.randn(out_features, in_features), torch.randn(6, in_features)
    layer = Linear(weight, None, pack=True, kernel_config=KERNELS)
    batch = layer(x)
    for i in range(6):
        torch.testing.assert_close(layer(x[i : i + 1]), batch[i : i + 1], rtol=0, atol=0)
    gate, up = torch.randn(out_features, in_features), torch.randn(out_features, in_features)
    swiglu = SwiGLU(gate, up, pack=True, kernel_config=KERNELS)
    torch.testing.assert_close(swiglu(x[:1]), swiglu(x)[:1], rtol=0, atol=0)


@pytest.mark.parametrize("rows", [1, 5, 32, 97, 300])
@pytest.mark.parametrize(("width", "in_features"), [(3, 40), (64, 576), (1539, 72)])
def test_packed_swiglu_matches_silu_of_gate_times_up(
    rows: int, width: int, in_features: int
) -> None:
    torch.manual_seed(rows + width)
    gate, up = torch.randn(width, in_features), torch.randn(width, in_features)
    x = torch.randn(rows, in_features) * 30  # gates far beyond the exp's clamp at -87 / 88
    expected = F.silu(F.linear(x, gate)) * F.linear(x, up)
    tolerance = {"rtol": 1e-5, "atol": 1e-5 * float(expected.abs().max())}
    packed = SwiGLU(gate, up, pack=True, kernel_config=KERNELS)
    torch.testing.assert_close(packed(x), expected, **tolerance)
    assert packed.width == width
    # unpacked (bfloat16, or packing switched off): torch ops on the concatenated weight
    torch.testing.assert_close(
        SwiGLU(gate, up, pack=False, kernel_config=KERNELS)(x), expected, **tolerance
    )


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 32, 300])
def test_bfloat16_packed_or_not_is_exactly_f_linear(pack: bool, rows: int) -> None:
    """bf16 weights packed in oneDNN's layout (where oneDNN has native bf16) run the kernels
    F.linear runs: identical bits, with and without bias, for SwiGLU too."""
    if pack and not packing_available(torch.bfloat16, KERNELS):
        pytest.skip("no native oneDNN bf16 on this host: bf16 weights stay unpacked")
    if pack and bf16_widen.available(KERNELS):
        pytest.skip(
            "kernels without AVX-512 here: bf16 layers widen their weights in their own "
            "summation order, not oneDNN's (tested in test_bf16_widen.py)"
        )
    torch.manual_seed(rows)
    weight, bias = torch.randn(96, 576).bfloat16(), torch.randn(96).bfloat16()
    x = torch.randn(rows, 576).bfloat16()
    for b in (None, bias):
        layer = Linear(weight, b, pack=pack, kernel_config=KERNELS)
        torch.testing.assert_close(layer(x), F.linear(x, weight, b), rtol=0, atol=0)
    gate, up = torch.randn(40, 576).bfloat16(), torch.randn(40, 576).bfloat16()
    expected = F.silu(F.linear(x, gate)) * F.linear(x, up)
    torch.testing.assert_close(
        SwiGLU(gate, up, pack=pack, kernel_config=KERNELS)(x), expected, rtol=0, atol=0
    )


@pytest.mark.parametrize(
    ("out_features", "in_features"), [(200, 576), (37, 1024), (48, 2), (576, 1536), (40, 3072)]
)
def test_bfloat16_decode_gemm_gives_f_linears_bits(out_features: int, in_features: int) -> None:
    """The runner's bf16 GEMM sums in oneDNN's order (K in blocks of 512, or of 1024 past
    K = 1024): F.linear's bits at every decode row count, ragged output widths included."""
    from modelyard.runner import kernels

    if not kernels.bf16_gemm_exact():
        pytest.skip(
            "no AVX-512 BF16, or oneDNN sums in another order (AMX: run under MODELYARD_ISA="
            "avx512-bf16 by test_isa_paths)"
        )
    torch.manual_seed(in_features)
    weight = torch.randn(out_features, in_features).bfloat16()
    packed = kernels.pack_bf16(weight)
    for rows in range(1, 65):
        x = torch.randn(rows, in_features).bfloat16()
        out = kernels.packed_linear_bf16(x, packed, out_features)
        torch.testing.assert_close(out, F.linear(x, weight), rtol=0, atol=0)


@pytest.mark.parametrize("in_features", [1536, 3072])
def test_bfloat16_decode_gemm_gives_f_linears_bits_on_single_rows(in_features: int) -> None:
    """One row (one request decoding) past K = 1024: oneDNN keeps blocks of 512 there, unlike
    at two rows and more; many rows drawn at random, since a different order shows in ~1 output
    in a few thousand."""
    from modelyard.runner import kernels

    if not kernels.bf16_gemm_exact():
        pytest.skip(
            "no AVX-512 BF16, or oneDNN sums in another order (AMX: run under MODELYARD_ISA="
            "avx512-bf16 by test_isa_paths)"
        )
    torch.manual_seed(in_features)
    weight = torch.randn(1536, in_features).bfloat16()
    packed = kernels.pack_bf16(weight)
    for _ in range(40):
        x = torch.randn(1, in_features).bfloat16()
        out = kernels.packed_linear_bf16(x, packed, 1536)
        torch.testing.assert_close(out, F.linear(x, weight), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("width", "in_features"), [(1536, 576), (40, 64), (1000, 1536), (37, 2048), (256, 3072)]
)
def test_bfloat16_fused_swiglu_gives_torchs_bits(width: int, in_features: int) -> None:
    """SwiGLU on the runner's bf16 GEMM, the activation applied to its tiles: the bits of
    F.silu(F.linear(x, gate)) * F.linear(x, up) (each of the three rounds to bf16) at decode
    and prefill row counts (oneDNN's summation order holds at every row count up to K = 3072),
    ragged widths, and gates deep in silu's tails. One known difference, shared with
    `kernels.silu_mul`: a gate in (-88.72, -88) gives 0 where torch gives ~1e-37 (its exp(-g)
    is still finite there); the product with up then differs by less than 1e-30."""
    from modelyard.runner import kernels

    if not kernels.bf16_gemm_exact():
        pytest.skip(
            "no AVX-512 BF16, or oneDNN sums in another order (AMX: run under MODELYARD_ISA="
            "avx512-bf16 by test_isa_paths)"
        )
    torch.manual_seed(width)
    gate = (torch.randn(width, in_features) * 0.3).bfloat16()
    up = torch.randn(width, in_features).bfloat16()
    layer = SwiGLU(gate, up, pack=True, kernel_config=KERNELS)
    assert layer._bf16 is not None  # the fused path, not oneDNN + silu_mul
    for rows in (1, 2, 7, 8, 9, 32, 64, 65, 200, 2048):
        x = (torch.randn(rows, in_features) * 2).bfloat16()
        expected = F.silu(F.linear(x, gate)) * F.linear(x, up)
        torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-30)


def test_bfloat16_gemm_refuses_the_other_kind_of_panels() -> None:
    """`pack_bf16` and `pack_swiglu_bf16` panels are told apart (4-D vs 5-D), so neither entry
    computes with the other's weights."""
    from modelyard.runner import kernels

    if not kernels.bf16_gemm_supported():
        pytest.skip("kernels built without AVX-512 BF16 on this host")
    weight, x = torch.randn(64, 96).bfloat16(), torch.randn(3, 96).bfloat16()
    plain, swiglu = kernels.pack_bf16(weight), kernels.pack_swiglu_bf16(weight, weight)
    with pytest.raises(RuntimeError, match="not from pack_swiglu_bf16"):
        kernels.packed_swiglu_bf16(x, plain, 32)
    with pytest.raises(RuntimeError, match="not from pack_bf16"):
        kernels.packed_linear_bf16(x, swiglu, 64)


def test_bfloat16_gemm_is_exact_where_onednn_runs_avx512_bf16() -> None:
    """The runner's bf16 GEMM is used only where its load-time check finds oneDNN's bits; on an
    AVX-512 BF16 host without AMX (oneDNN's AVX-512 BF16 kernels, the order the GEMM follows)
    the check must pass, as must the AMX kernel's where the kernels have AMX tiles, so a GEMM
    that lost the order fails here instead of the tests above skipping. Linear and SwiGLU then
    run it; elsewhere they stay on oneDNN."""
    from modelyard.runner import kernels

    config = KERNELS
    if config.isa == "avx512-bf16" and config.host == "avx512-bf16":
        assert kernels.bf16_gemm_exact()
        assert kernels.bf16_gemm_path(KERNELS.bf16_gemm) == "avx512"
    if kernels.amx_ready():
        assert kernels.amx_gemm_exact()
        assert kernels.bf16_gemm_path(KERNELS.bf16_gemm) == "amx"
    pack = packing_available(torch.bfloat16, KERNELS)  # as the model packs its weights
    runs = pack and kernels.bf16_gemm_path(KERNELS.bf16_gemm) is not None
    weight = torch.randn(64, 576).bfloat16()
    assert (Linear(weight, None, pack=pack, kernel_config=KERNELS)._bf16 is not None) == runs
    assert (SwiGLU(weight, weight, pack=pack, kernel_config=KERNELS)._bf16 is not None) == runs


def test_bfloat16_packing_follows_the_host() -> None:
    """Packed where oneDNN runs bf16 natively (AVX-512 BF16 / AMX), and as widened panels
    where the kernels have no AVX-512 (runner.bf16_widen)."""
    from modelyard.runner import kernels

    native = kernels.cpu_has("avx512_bf16") and KERNELS.has("avx512-bf16")
    onednn = native and torch.backends.mkldnn.is_available()
    assert packing_available(torch.bfloat16, KERNELS) == (onednn or bf16_widen.available(KERNELS))


def test_packing_can_be_switched_off() -> None:
    switched_off = KernelConfig.from_env({"MODELYARD_PACKED_LINEAR": "0"})
    assert not packing_available(torch.float32, switched_off)
