"""Paged attention against plain torch SDPA on contiguous, unpaged K/V: grouped decode attention
(GQA, padded lengths, sliding window, fp32 and bf16) and whole mixed steps (decodes + a fresh
prefill chunk + a chunk continuing a cached prefix) through `paged_attention`, with decodes on
the compiled kernel and on the torch path."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from modelyard.engine.config import kernels_from_environment
from modelyard.runner import attention, kernels
from modelyard.runner.attention import (
    AttentionMetadata,
    grouped_decode_attention,
    paged_attention,
    store_kv,
)

KERNELS = kernels_from_environment()  # the switches of this test run's environment

pytestmark = pytest.mark.unit

NKV, GROUP, HD, BS = 2, 3, 16, 4
NH = NKV * GROUP
SCALE = HD**-0.5


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """q (n, nh, hd) at positions [start, start + n); k/v (start + n, nkv, hd) -> (n, nh, hd)."""
    n, total = q.shape[0], k.shape[0]
    mask = torch.arange(total).unsqueeze(0) <= torch.arange(start, start + n).unsqueeze(1)
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0).double(),
        k.transpose(0, 1).unsqueeze(0).double(),
        v.transpose(0, 1).unsqueeze(0).double(),
        attn_mask=mask,
        scale=SCALE,
        enable_gqa=True,
    )
    return o.squeeze(0).transpose(0, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_decode_matches_sdpa_with_gqa_and_padding(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    lengths = [1, 7, 24, 13, 2]  # keys per request; the rest of the 24 columns is padding
    d, width = len(lengths), max(lengths)
    q = torch.randn(d, NH, HD).to(dtype)
    k = torch.randn(NKV, d, width, HD).to(dtype).transpose(0, 1)  # strided, as gathered
    v = torch.randn(NKV, d, width, HD).to(dtype).transpose(0, 1)
    allowed = torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)  # (D, L)
    mask = allowed.view(d, 1, 1, width)
    out = grouped_decode_attention(q, k, v, mask, SCALE)
    assert out.dtype == dtype
    assert out.shape == (d, NH, HD)
    ref = F.scaled_dot_product_attention(
        q.double().unsqueeze(2),
        k.double(),
        v.double(),
        attn_mask=mask,
        scale=SCALE,
        enable_gqa=True,
    ).squeeze(2)  # (D, nh, hd)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    if dtype == torch.bfloat16:  # the same kernel as SDPA's own GQA: identical bits
        same = F.scaled_dot_product_attention(
            q.unsqueeze(2), k, v, attn_mask=mask, scale=SCALE, enable_gqa=True
        ).squeeze(2)
        torch.testing.assert_close(out, same, atol=0, rtol=0)
    # padding really is ignored: garbage beyond each length changes nothing
    padding = ~allowed.view(d, 1, width, 1)
    k2, v2 = k.masked_fill(padding, 1e4), v.masked_fill(padding, -1e4)
    torch.testing.assert_close(grouped_decode_attention(q, k2, v2, mask, SCALE), out)


@pytest.fixture(params=["native", "torch"])
def decode_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with decodes on the compiled kernel (which must have built) or on torch."""
    if request.param == "native":
        assert kernels.load(KERNELS), "the native kernels did not build (see scripts/setup)"
        assert attention.native_decode_ready(torch.float32, HD)
    else:
        monkeypatch.setattr(attention, "native_decode_ready", lambda dtype, head_dim: False)
    return str(request.param)


def _cache(num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(NKV, num_blocks, BS, HD), torch.zeros(NKV, num_blocks, BS, HD)


def _write_history(
    caches: tuple[torch.Tensor, torch.Tensor], table: list[int], k: torch.Tensor, v: torch.Tensor
) -> None:
    """Store positions [0, len(k)) of one request as if earlier steps had written them."""
    for p in range(k.shape[0]):
        block, offset = table[p // BS], p % BS
        caches[0][:, block, offset] = k[p]
        caches[1][:, block, offset] = v[p]


@pytest.mark.usefixtures("decode_path")
@pytest.mark.parametrize("prefill_sdpa", [False, True], ids=["kernel-prompts", "sdpa-prompts"])
def test_mixed_step_matches_unpaged_sdpa(prefill_sdpa: bool) -> None:
    """Decodes, a fresh prefill and a continued prefill in one flat batch, scattered blocks;
    prompt rows on the kernel or on SDPA (MODELYARD_PREFILL_SDPA)."""
    torch.manual_seed(1)
    rng = random.Random(1)
    starts = [9, 0, 5, 30, 10]  # cached tokens before this step
    lengths = [1, 6, 1, 1, 7]  # new tokens this step (1 = decode)
    free = list(range(1, 40))
    rng.shuffle(free)
    tables = []
    for s, n in zip(starts, lengths, strict=True):
        nb = (s + n + BS - 1) // BS
        tables.append([free.pop() for _ in range(nb)])
    caches = _cache(40)
    full_k = [torch.randn(s + n, NKV, HD) for s, n in zip(starts, lengths, strict=True)]
    full_v = [torch.randn(s + n, NKV, HD) for s, n in zip(starts, lengths, strict=True)]
    for table, s, k, v in zip(tables, starts, full_k, full_v, strict=True):
        _write_history(caches, table, k[:s], v[:s])
    q = torch.randn(sum(lengths), NH, HD)
    new_k = torch.cat([k[s:] for k, s in zip(full_k, starts, strict=True)])
    new_v = torch.cat([v[s:] for v, s in zip(full_v, starts, strict=True)])
    meta = AttentionMetadata.build(starts, lengths, tables, BS)
    store_kv(new_k, new_v, caches[0], caches[1], meta)
    out = paged_attention(
        q, new_k, new_v, caches[0], caches[1], meta, SCALE, prefill_sdpa=prefill_sdpa
    )
    row = 0
    for i, (s, n) in enumerate(zip(starts, lengths, strict=True)):
        ref = _reference(q[row : row + n], full_k[i], full_v[i], s)
        torch.testing.assert_close(out[row : row + n].double(), ref, atol=1e-5, rtol=1e-5)
        row += n
    probe = AttentionMetadata.build([0], [starts[3] + 1], [tables[3]], BS)  # cache was written
    torch.testing.assert_close(
        caches[0].view(NKV, -1, HD).index_select(1, probe.slot_mapping).transpose(0, 1), full_k[3]
    )


@pytest.mark.usefixtures("decode_path")
@pytest.mark.parametrize("window", [None, 5])
def test_all_decode_step_matches_unpaged_sdpa(window: int | None) -> None:
    torch.manual_seed(2)
    starts = [0, 3, 17, 8]
    tables = [[4], [2], [7, 1, 9, 3, 5], [6, 8, 10]]
    caches = _cache(11)
    full_k = [torch.randn(s + 1, NKV, HD) for s in starts]
    full_v = [torch.randn(s + 1, NKV, HD) for s in starts]
    for table, s, k, v in zip(tables, starts, full_k, full_v, strict=True):
        _write_history(caches, table, k[:s], v[:s])
    q = torch.randn(len(starts), NH, HD)
    meta = AttentionMetadata.build(starts, [1] * len(starts), tables, BS, window)
    new_k = torch.stack([k[-1] for k in full_k])
    new_v = torch.stack([v[-1] for v in full_v])
    store_kv(new_k, new_v, caches[0], caches[1], meta)
    out = paged_attention(q, new_k, new_v, caches[0], caches[1], meta, SCALE, prefill_sdpa=False)
    for i, s in enumerate(starts):
        first = 0 if window is None else max(0, s + 1 - window)
        ref = _reference(q[i : i + 1], full_k[i][first:], full_v[i][first:], s - first)
        torch.testing.assert_close(out[i : i + 1].double(), ref, atol=1e-5, rtol=1e-5)


def test_native_kernel_rejects_a_block_id_outside_the_cache() -> None:
    assert kernels.load(KERNELS)
    k_cache, v_cache = _cache(3)
    q = torch.randn(1, NH, HD)
    with pytest.raises(RuntimeError, match="bad block id"):
        kernels.paged_decode_attention(
            q, k_cache, v_cache, torch.tensor([[7]]), torch.tensor([2]), SCALE, None
        )
    with pytest.raises(RuntimeError, match="bad seq_len"):
        kernels.paged_decode_attention(
            q, k_cache, v_cache, torch.tensor([[1]]), torch.tensor([BS + 1]), SCALE, None
        )


@pytest.mark.parametrize("window", [None, 5])
def test_native_bfloat16_decode_matches_sdpa_to_one_rounding(
    window: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel reads a bf16 cache in place and follows SDPA's bf16 arithmetic; only the
    float32 summation order differs, so a probability (rounded to bf16 before the sum over
    values, as SDPA does) or an output lands on the other bf16 neighbour now and then: a
    difference of about one bf16 step of the values' scale, in a few elements."""
    assert attention.native_decode_ready(torch.bfloat16, HD)
    torch.manual_seed(3)
    starts = [0, 3, 17, 8, 14]
    tables = [[4], [2], [7, 1, 9, 3, 5], [6, 8, 10], [11, 12, 13, 14]]
    k_cache, v_cache = _cache(15)
    k_cache, v_cache = k_cache.bfloat16(), v_cache.bfloat16()
    for table, s in zip(tables, starts, strict=True):
        k, v = torch.randn(s, NKV, HD), torch.randn(s, NKV, HD)
        _write_history((k_cache, v_cache), table, k.bfloat16(), v.bfloat16())
    q = torch.randn(len(starts), NH, HD).bfloat16()
    meta = AttentionMetadata.build(starts, [1] * len(starts), tables, BS, window)
    new_k = torch.randn(len(starts), NKV, HD).bfloat16()
    new_v = torch.randn(len(starts), NKV, HD).bfloat16()
    store_kv(new_k, new_v, k_cache, v_cache, meta)
    native = paged_attention(q, new_k, new_v, k_cache, v_cache, meta, SCALE, prefill_sdpa=False)
    monkeypatch.setattr(attention, "native_decode_ready", lambda dtype, head_dim: False)
    sdpa = paged_attention(q, new_k, new_v, k_cache, v_cache, meta, SCALE, prefill_sdpa=False)
    assert native.dtype == torch.bfloat16
    torch.testing.assert_close(native.float(), sdpa.float(), atol=2**-9, rtol=2**-7)
    assert (native == sdpa).float().mean() > 0.95


@pytest.mark.parametrize(("group", "head_dim"), [(3, 64), (2, 128), (5, 64)])
@pytest.mark.parametrize("window", [None, 21])
def test_native_bfloat16_decode_at_model_shapes(
    group: int, head_dim: int, window: int | None
) -> None:
    """Model-sized heads: 3 query heads per KV head of size 64 (the default model's, which on
    AVX-512 BF16 hosts run the kernel's `vdpbf16ps` path), size 128, and a group of 5 (the
    widened path everywhere). Against float64 attention over the same bf16 inputs, within bf16
    rounding, at lengths that end inside a 16-key block, on its edge and one past it, with the
    blocks scattered over the cache."""
    assert kernels.load(KERNELS), "the native kernels did not build (see scripts/setup)"
    torch.manual_seed(5)
    nkv, bs, lens = 2, 16, [1, 15, 16, 17, 33, 190]
    counts = [(n + bs - 1) // bs for n in lens]
    ids = (torch.randperm(sum(counts) + 4)[: sum(counts)] + 1).tolist()
    tables = torch.zeros(len(lens), max(counts), dtype=torch.long)
    for r, count in enumerate(counts):
        tables[r, :count] = torch.tensor(ids[sum(counts[:r]) : sum(counts[: r + 1])])
    k_cache = torch.randn(nkv, sum(counts) + 5, bs, head_dim).bfloat16()
    v_cache = torch.randn(nkv, sum(counts) + 5, bs, head_dim).bfloat16()
    q = torch.randn(len(lens), nkv * group, head_dim).bfloat16()
    scale = head_dim**-0.5
    out = kernels.paged_decode_attention(
        q, k_cache, v_cache, tables, torch.tensor(lens), scale, window
    )
    assert out.dtype == torch.bfloat16
    for r, n in enumerate(lens):
        first = max(0, n - window) if window else 0
        k = k_cache[:, tables[r, : counts[r]]].reshape(nkv, -1, head_dim)[:, first:n]
        v = v_cache[:, tables[r, : counts[r]]].reshape(nkv, -1, head_dim)[:, first:n]
        ref = F.scaled_dot_product_attention(
            q[r].double().unsqueeze(1), k.double(), v.double(), scale=scale, enable_gqa=True
        ).squeeze(1)
        torch.testing.assert_close(out[r].double(), ref, atol=4e-3, rtol=8e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_decode_reads_query_rows_in_place_and_keeps_nan(dtype: torch.dtype) -> None:
    """q may be a view of wider rows (the fused qkv output): the same bits as its contiguous
    copy. A NaN in one query head gives NaN in that head's output only (bf16: the bits torch's
    conversion gives a NaN)."""
    assert kernels.load(KERNELS), "the native kernels did not build (see scripts/setup)"
    torch.manual_seed(6)
    nkv, group, hd, bs, lens = 3, 3, 64, 16, [5, 40, 190]
    nb = (max(lens) + bs - 1) // bs
    tables = torch.arange(1, 1 + len(lens) * nb).view(len(lens), nb)
    k_cache = torch.randn(nkv, len(lens) * nb + 1, bs, hd).to(dtype)
    v_cache = torch.randn(nkv, len(lens) * nb + 1, bs, hd).to(dtype)
    rows = torch.randn(len(lens), (nkv * group + 2 * nkv) * hd).to(dtype)  # [q | k | v]
    rows[1, 5] = float("nan")  # request 1, query head 0
    q = rows[:, : nkv * group * hd].view(len(lens), nkv * group, hd)
    assert not q.is_contiguous()
    seq_lens = torch.tensor(lens)
    strided = kernels.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.125, None)
    packed = kernels.paged_decode_attention(
        q.contiguous(), k_cache, v_cache, tables, seq_lens, 0.125, None
    )
    assert strided.is_contiguous()
    assert strided.dtype == dtype
    assert torch.equal(strided[[0, 2]], packed[[0, 2]])
    assert torch.equal(strided[1, 1:], packed[1, 1:])
    assert strided[1, 0].isnan().all()
    assert packed[1, 0].isnan().all()
    assert not strided[[0, 2]].isnan().any()
    assert not strided[1, 1:].isnan().any()
    if dtype == torch.bfloat16:
        torch_nan = torch.full((hd,), float("nan")).bfloat16()  # torch's bits for a NaN
        assert torch.equal(strided[1, 0].view(torch.int16), torch_nan.view(torch.int16))


@pytest.mark.parametrize("window", [None, 6])
def test_kernel_attends_prefill_rows_as_sdpa_does_in_bfloat16(
    window: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bf16 step with decodes, a fresh prefill chunk and a chunk continuing a cached prefix:
    the kernel attends every row in one call; each row agrees with SDPA's per-chunk attention
    (the torch path) to a bf16 rounding, and with MODELYARD_PREFILL_SDPA's switch the prefill
    rows are SDPA's own bits."""
    assert attention.native_decode_ready(torch.bfloat16, HD)
    torch.manual_seed(7)
    starts, lengths = [9, 0, 5, 12], [1, 13, 1, 8]
    tables = [[3, 1, 8], [2, 5, 9, 11], [4, 6], [7, 10, 12, 13, 14]]
    k_cache, v_cache = (c.bfloat16() for c in _cache(15))
    for table, s in zip(tables, starts, strict=True):
        history = (torch.randn(s, NKV, HD).bfloat16(), torch.randn(s, NKV, HD).bfloat16())
        _write_history((k_cache, v_cache), table, *history)
    q = torch.randn(sum(lengths), NH, HD).bfloat16()
    new_k = torch.randn(sum(lengths), NKV, HD).bfloat16()
    new_v = torch.randn(sum(lengths), NKV, HD).bfloat16()
    meta = AttentionMetadata.build(starts, lengths, tables, BS, window)
    store_kv(new_k, new_v, k_cache, v_cache, meta)
    native = paged_attention(q, new_k, new_v, k_cache, v_cache, meta, SCALE, prefill_sdpa=False)
    sdpa_prefills = paged_attention(
        q, new_k, new_v, k_cache, v_cache, meta, SCALE, prefill_sdpa=True
    )
    monkeypatch.setattr(attention, "native_decode_ready", lambda dtype, head_dim: False)
    torch_path = paged_attention(q, new_k, new_v, k_cache, v_cache, meta, SCALE, prefill_sdpa=False)
    torch.testing.assert_close(native.float(), torch_path.float(), atol=2**-8, rtol=2**-7)
    assert (native == torch_path).float().mean() > 0.9
    prefill_rows = torch.cat([torch.arange(1, 14), torch.arange(15, 23)])
    assert torch.equal(sdpa_prefills[prefill_rows], torch_path[prefill_rows])
    assert torch.equal(sdpa_prefills[[0, 14]], native[[0, 14]])  # the decodes: the kernel's


@pytest.mark.parametrize("window", [None, 3])
def test_with_window_equals_metadata_built_with_it(window: int | None) -> None:
    """A step's metadata re-windowed per layer (runner.models.decoder) masks as if built so."""
    args = ([0, 6, 9], [7, 1, 4], [[0, 1], [2, 3], [4, 5, 6, 7]], 4)
    built = AttentionMetadata.build(*args, sliding_window=window)
    other = AttentionMetadata.build(*args, sliding_window=5).with_window(window)
    assert other.sliding_window == window
    assert torch.equal(other.decode_mask(), built.decode_mask())
    for a, b in zip(other.prefills, built.prefills, strict=True):
        assert (a.mask is None) == (b.mask is None)
        assert a.mask is None or torch.equal(a.mask, b.mask)
