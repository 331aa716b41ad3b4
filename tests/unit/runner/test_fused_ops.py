"""The compiled element-wise ops (runner.kernels / csrc/fused_ops.cpp, csrc/rms_norm.cpp)
against the torch ops they replace, in float32 and bfloat16 (where they must round where the
torch ops do), and a whole forward with and without them."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch

from modelyard.engine.config import kernels_from_environment
from modelyard.runner import kernels
from modelyard.runner.attention import AttentionMetadata
from modelyard.runner.models import decoder, rope
from modelyard.runner.weights import SafetensorsSource

KERNELS = kernels_from_environment()  # the switches of this test run's environment

pytestmark = pytest.mark.unit

TOL = {"atol": 2e-6, "rtol": 2e-6}


@pytest.fixture(autouse=True)
def _built() -> None:
    assert kernels.load(KERNELS), "the native kernels did not build (see scripts/setup)"


@pytest.mark.parametrize("rows", [1, 5, 300])  # 300 rows split across threads
def test_rms_norm_and_add_rms_norm_match_torch(rows: int) -> None:
    torch.manual_seed(0)
    x, delta, w = torch.randn(rows, 72) * 3, torch.randn(rows, 72), torch.randn(72)
    torch.testing.assert_close(
        kernels.rms_norm(x, w, 1e-5), decoder.rms_norm(x, w, 1e-5, offset=False), **TOL
    )
    residual = x.clone()
    normed = kernels.add_rms_norm(residual, delta, w, 1e-6)
    torch.testing.assert_close(residual, x + delta, atol=0, rtol=0)  # updated in place
    torch.testing.assert_close(normed, decoder.rms_norm(x + delta, w, 1e-6, offset=False), **TOL)


def test_rope_store_rotates_in_place_and_writes_the_cache() -> None:
    torch.manual_seed(2)
    nh, nkv, hd, bs, num_blocks = 6, 2, 16, 4, 5
    config = type("Config", (), {"rope_parameters": {"rope_theta": 10000.0}})()
    cos, sin = rope.rotary_tables(config, "", hd, torch.float32, 64)
    positions = torch.tensor([0, 7, 63])
    slots = torch.tensor([3, 17, 9])
    qkv = torch.randn(3, (nh + 2 * nkv) * hd)
    k_cache, v_cache = torch.zeros(nkv, num_blocks, bs, hd), torch.zeros(nkv, num_blocks, bs, hd)
    heads = qkv.view(3, nh + 2 * nkv, hd)
    expected_qk = rope.rotate(heads[:, : nh + nkv], cos[positions, None], sin[positions, None])
    expected_v = heads[:, nh + nkv :].clone()
    kernels.rope_store(qkv, cos, sin, positions, k_cache, v_cache, slots, nh)
    torch.testing.assert_close(heads[:, : nh + nkv], expected_qk, **TOL)
    flat_k, flat_v = k_cache.view(nkv, -1, hd), v_cache.view(nkv, -1, hd)
    torch.testing.assert_close(flat_k[:, slots].transpose(0, 1), expected_qk[:, nh:], **TOL)
    torch.testing.assert_close(flat_v[:, slots].transpose(0, 1), expected_v, atol=0, rtol=0)
    untouched = torch.ones(nkv * num_blocks * bs, dtype=torch.bool).view(nkv, -1)
    untouched[:, slots] = False
    assert not flat_k[untouched].any()
    assert not flat_v[untouched].any()


def _bf16_steps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many bf16 steps apart two bf16 tensors of one sign pattern are, elementwise."""
    bits = [t.view(torch.int16).to(torch.int32) for t in (a, b)]
    return (bits[0] - bits[1]).abs()


@pytest.mark.parametrize("rows", [1, 5, 300])
def test_bfloat16_norms_are_exactly_torchs(rows: int) -> None:
    """bf16: the residual sum and HF's RMSNorm, bit for bit (outliers as in real activations)."""
    torch.manual_seed(rows)
    x, delta = (torch.randn(rows, 576) * 3).bfloat16(), torch.randn(rows, 576).bfloat16()
    x[:, 7] = 300.0
    w = torch.randn(576).bfloat16()
    torch.testing.assert_close(
        kernels.rms_norm(x, w, 1e-5), decoder.rms_norm(x, w, 1e-5, offset=False), atol=0, rtol=0
    )
    residual = x.clone()
    normed = kernels.add_rms_norm(residual, delta, w, 1e-5)
    torch.testing.assert_close(residual, x + delta, atol=0, rtol=0)
    torch.testing.assert_close(
        normed, decoder.rms_norm(x + delta, w, 1e-5, offset=False), atol=0, rtol=0
    )


@pytest.mark.parametrize("width", [0, 8, 16])
def test_bfloat16_add_rms_norm_in_either_pass_keeps_torchs_bits_and_nan(width: int) -> None:
    """With torch's own reduction (sum width 0: add, torch's mean, scale) and with its order
    reproduced (one pass per row), in-place residual and norm are torch's bits; a NaN in a row
    stays NaN where torch's does, the other rows unchanged; ragged rows (a scalar tail)."""
    torch.manual_seed(width)
    for h in (576, 203):
        x, delta = (torch.randn(9, h) * 3).bfloat16(), torch.randn(9, h).bfloat16()
        x[2, 5] = float("nan")
        w = torch.randn(h).bfloat16()
        residual = x.clone()
        normed = torch.ops.modelyard_kernels.add_rms_norm(residual, delta, w, 1e-5, width)
        expected = decoder.rms_norm(x + delta, w, 1e-5, offset=False)
        assert torch.equal(residual.isnan(), (x + delta).isnan())
        assert torch.equal(normed.isnan(), expected.isnan())
        assert bool(normed[2].isnan().all())
        if width in (0, kernels.torch_sum_width()):  # the order torch sums in on this host
            torch.testing.assert_close(normed, expected, atol=0, rtol=0, equal_nan=True)
        torch.testing.assert_close(residual, x + delta, atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize(
    ("rows", "width"),
    [
        *((33, width) for width in (1, 5, 7, 8, 15, 64, 576, 1000, 4096, 8200)),
        (1, 40000),
    ],
)
def test_mean_of_squares_in_torchs_order_is_torchs(rows: int, width: int) -> None:
    """Where the kernels reproduce torch's float32 sum (x86: its vectorized cascade sum), the
    mean of squares of a bf16 row equals torch's bit for bit: rows shorter than one vector
    (torch's scalar cascade), leftover vectors and scalars, past the first level of the chunked
    sum (4096, 8200), and one long row (which torch splits across threads: torch's own sum
    then). Values spread over many orders of magnitude, so a different order shows."""
    sum_width = kernels.torch_sum_width()
    if platform.machine() in ("x86_64", "AMD64"):
        assert sum_width in (8, 16)
    torch.manual_seed(width)
    x = (torch.randn(rows, width) * torch.exp(3 * torch.randn(rows, width))).bfloat16()
    ours = torch.ops.modelyard_kernels.mean_squares(x, sum_width)
    torch.testing.assert_close(ours, x.float().pow(2).mean(-1), atol=0, rtol=0)


def test_bfloat16_rope_store_is_exactly_torchs() -> None:
    """Each product rounded to bf16, then their sum: the same bits as HF's bf16 RoPE."""
    torch.manual_seed(4)
    nh, nkv, hd, bs, num_blocks = 6, 2, 16, 4, 5
    config = type("Config", (), {"rope_parameters": {"rope_theta": 10000.0}})()
    cos, sin = rope.rotary_tables(config, "", hd, torch.bfloat16, 64)
    positions, slots = torch.tensor([0, 7, 63]), torch.tensor([3, 17, 9])
    qkv = torch.randn(3, (nh + 2 * nkv) * hd).bfloat16()
    cache = torch.zeros(nkv, num_blocks, bs, hd, dtype=torch.bfloat16)
    k_cache, v_cache = cache, cache.clone()
    heads = qkv.view(3, nh + 2 * nkv, hd)
    expected_qk = rope.rotate(heads[:, : nh + nkv], cos[positions, None], sin[positions, None])
    expected_v = heads[:, nh + nkv :].clone()
    kernels.rope_store(qkv, cos, sin, positions, k_cache, v_cache, slots, nh)
    torch.testing.assert_close(heads[:, : nh + nkv], expected_qk, atol=0, rtol=0)
    flat_k, flat_v = k_cache.view(nkv, -1, hd), v_cache.view(nkv, -1, hd)
    torch.testing.assert_close(
        flat_k[:, slots].transpose(0, 1), expected_qk[:, nh:], atol=0, rtol=0
    )
    torch.testing.assert_close(flat_v[:, slots].transpose(0, 1), expected_v, atol=0, rtol=0)


@pytest.mark.parametrize(("rows", "width"), [(1, 13), (32, 1536), (300, 40)])
def test_bfloat16_silu_mul_rounds_like_torchs_two_ops(rows: int, width: int) -> None:
    torch.manual_seed(width)
    both = (torch.randn(rows, 2 * width) * 4).bfloat16()
    both[0, :4] = torch.tensor([-200.0, 200.0, 0.0, -0.0])  # far past the exp clamp, and zeros
    gate, up = both.chunk(2, dim=-1)
    expected = torch.nn.functional.silu(gate) * up
    ours = kernels.silu_mul(both)
    assert ours.dtype == torch.bfloat16
    assert ours.shape == (rows, width)
    # exp differs from torch's in the last float32 bit at most: now and then a neighbour
    assert int(_bf16_steps_apart(ours, expected).max()) <= 1
    assert float((ours == expected).float().mean()) > 0.99


def test_bfloat16_silu_mul_keeps_nan_where_torch_does() -> None:
    """A NaN gate or up gives NaN where torch's bf16 ops give it, and every other output keeps
    torch's bits, on the 16-lane, 8-lane and scalar paths (width 40 = 16 + 16 + 8; 13 = 8 + 5).
    (A NaN's own bits follow torch's tensor conversion, 0xFFFF; torch's scalar tail writes
    0x7FC0, so they are not compared.)"""
    for width in (40, 13):
        both = torch.ones(2, 2 * width).bfloat16()
        both[0, :width:3] = float("nan")  # gates
        both[1, width + 1 :: 3] = float("nan")  # ups
        expected = torch.nn.functional.silu(both[:, :width]) * both[:, width:]
        ours = kernels.silu_mul(both)
        assert torch.equal(ours.isnan(), expected.isnan())
        assert int(expected.isnan().sum()) > 0
        assert torch.equal(ours.nan_to_num(7.0), expected.nan_to_num(7.0))


def test_rope_store_rejects_a_slot_outside_the_cache() -> None:
    qkv = torch.randn(1, 4 * 8)
    cos = sin = torch.ones(4, 8)
    cache = torch.zeros(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="slot out of range"):
        kernels.rope_store(qkv, cos, sin, torch.tensor([1]), cache, cache.clone(),
                           torch.tensor([8]), 2)  # fmt: skip


@pytest.mark.parametrize("name", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_forward_matches_the_torch_forward(
    tiny_models: dict[str, Path], name: str, dtype: torch.dtype
) -> None:
    """A prefill step then a decode step: logits of both paths agree (float32 up to summation
    order; bfloat16 bit for bit, both paths running the same decode-attention kernel)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_models[name])
    models = []
    for fused in (True, False):
        model = decoder.DecoderModel(
            SafetensorsSource(tiny_models[name]), config.architectures[0], config, dtype=dtype,
            num_blocks=8, block_size=4, max_model_len=64, kernel_config=KERNELS,
        )  # fmt: skip
        model.fused = fused
        models.append(model)
    assert models[0].fused != models[1].fused
    prompt = torch.tensor([5, 9, 2, 33, 8, 1, 7])
    table = [3, 1]
    steps = [
        (prompt, AttentionMetadata.build([0], [7], [table], 4), torch.tensor([6])),
        (torch.tensor([11]), AttentionMetadata.build([7], [1], [table], 4), torch.tensor([0])),
    ]
    with torch.inference_mode():
        for ids, meta, rows in steps:
            fused_logits, torch_logits = (m.forward(ids, meta, rows) for m in models)
            tol = 1e-4 if dtype == torch.float32 else 0.0
            torch.testing.assert_close(fused_logits, torch_logits, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("width", [1, 7, 8, 49152, 49157])  # vector body and scalar tail
def test_argmax_rows_matches_torch_with_ties_nan_and_inf(width: int, dtype: torch.dtype) -> None:
    torch.manual_seed(3)
    x = torch.randn(6, width).to(dtype)  # bf16: many equal values, so ties in every row
    x[1] = 0.5  # all equal: the first index
    x[2, -1] = float("inf")  # the maximum in the tail
    x[3] = float("-inf")  # nothing finite
    x[4, width // 2] = float("nan")  # NaN counts as the maximum, as in torch
    x[5, :: max(1, width // 3)] = 9.0  # ties: the first of them
    expected = x.argmax(dim=-1)
    torch.testing.assert_close(kernels.argmax_rows(x), expected, atol=0, rtol=0)
