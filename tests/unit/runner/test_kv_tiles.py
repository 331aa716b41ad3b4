"""The tile layout of a bf16 KV cache on AMX hosts (runner.kv_layout): rope_store writes
it, decode attention reads it (csrc/decode_tiles.cpp, decode_tiles), and the result is the
plain layout's attention to a bf16 rounding. Skipped where AMX tiles do not run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from modelyard.runner import kernels, kv_layout
from modelyard.runner.kernel_config import KernelConfig
from modelyard.runner.models import rope

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(not kernels.amx_ready(), reason="AMX tiles do not run on this host"),
]


def to_tiles(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain (nkv, NB, bs, hd) caches -> the tile layout: K blocks (hd/2, bs, 2), V blocks
    (bs/2, hd, 2), in the same (nkv, NB, bs, hd) tensors' memory."""
    nkv, nb, bs, hd = k.shape
    kt = k.view(nkv, nb, bs, hd // 2, 2).permute(0, 1, 3, 2, 4).contiguous().view(k.shape)
    vt = v.view(nkv, nb, bs // 2, 2, hd).permute(0, 1, 2, 4, 3).contiguous().view(v.shape)
    return kt, vt


def scattered_tables(lens: list[int], bs: int) -> tuple[torch.Tensor, int]:
    counts = [(n + bs - 1) // bs for n in lens]
    ids = (torch.randperm(sum(counts) + 3)[: sum(counts)] + 1).tolist()
    tables = torch.zeros(len(lens), max(counts), dtype=torch.long)
    for r, count in enumerate(counts):
        tables[r, :count] = torch.tensor(ids[sum(counts[:r]) : sum(counts[: r + 1])])
    return tables, sum(counts) + 4


@pytest.mark.parametrize("group", [1, 2, 3, 4])
@pytest.mark.parametrize(("bs", "window"), [(16, None), (16, 21), (32, None)])
def test_tile_layout_attention_matches_the_plain_layout(
    group: int, bs: int, window: int | None
) -> None:
    """The same keys and values in either layout: the tile kernel's output is the plain
    kernel's to a bf16 rounding, and float64 attention's within bf16 rounding, at lengths that
    end inside a 16-key chunk, on its edge and past it, blocks scattered over the cache."""
    torch.manual_seed(group * 100 + bs)
    nkv, hd, lens = 2, 64, [1, 15, 16, 17, 33, 190]
    tables, num_blocks = scattered_tables(lens, bs)
    k = torch.randn(nkv, num_blocks, bs, hd).bfloat16()
    v = torch.randn(nkv, num_blocks, bs, hd).bfloat16()
    q = torch.randn(len(lens), nkv * group, hd).bfloat16()
    seq_lens, scale = torch.tensor(lens), hd**-0.5
    plain = kernels.paged_decode_attention(q, k, v, tables, seq_lens, scale, window)
    tiles = kernels.paged_decode_attention(
        q, *to_tiles(k, v), tables, seq_lens, scale, window, kv_layout.KV_TILES
    )
    assert tiles.dtype == torch.bfloat16
    assert tiles.is_contiguous()
    torch.testing.assert_close(tiles.float(), plain.float(), atol=2**-8, rtol=2**-7)
    assert (tiles == plain).float().mean() > 0.9
    counts = [(n + bs - 1) // bs for n in lens]
    for r, n in enumerate(lens):
        first = max(0, n - window) if window else 0
        kr = k[:, tables[r, : counts[r]]].reshape(nkv, -1, hd)[:, first:n]
        vr = v[:, tables[r, : counts[r]]].reshape(nkv, -1, hd)[:, first:n]
        ref = F.scaled_dot_product_attention(
            q[r].double().unsqueeze(1), kr.double(), vr.double(), scale=scale, enable_gqa=True
        ).squeeze(1)
        torch.testing.assert_close(tiles[r].double(), ref, atol=4e-3, rtol=8e-3)


def test_tile_layout_ignores_whatever_stale_slots_hold() -> None:
    """Slots past a request's last key in its last block (a freed block's old rows) may hold
    anything, NaN included: the output is the same as with zeros there."""
    torch.manual_seed(3)
    nkv, group, hd, bs, lens = 3, 3, 64, 16, [5, 20, 40]
    nb = 3
    tables = torch.arange(1, 1 + len(lens) * nb).view(len(lens), nb)
    k = torch.randn(nkv, len(lens) * nb + 1, bs, hd).bfloat16()
    v = torch.randn(nkv, len(lens) * nb + 1, bs, hd).bfloat16()
    stale_k, stale_v = k.clone(), v.clone()
    for r, n in enumerate(lens):
        flat_k = stale_k[:, tables[r]].reshape(nkv, -1, hd)
        flat_k[:, n:] = float("nan")
        stale_k[:, tables[r]] = flat_k.view(nkv, nb, bs, hd)
        flat_v = stale_v[:, tables[r]].reshape(nkv, -1, hd)
        flat_v[:, n:] = float("nan")
        stale_v[:, tables[r]] = flat_v.view(nkv, nb, bs, hd)
    q = torch.randn(len(lens), nkv * group, hd).bfloat16()
    args = (torch.tensor(lens), 0.125, None, kv_layout.KV_TILES)
    clean = kernels.paged_decode_attention(q, *to_tiles(k, v), tables, *args)
    stale = kernels.paged_decode_attention(q, *to_tiles(stale_k, stale_v), tables, *args)
    assert not stale.isnan().any()
    assert torch.equal(clean, stale)


def test_rope_store_writes_the_tile_layout() -> None:
    """The same rows rope_store writes in the plain layout, at their places in the tiles."""
    torch.manual_seed(4)
    nh, nkv, hd, bs, num_blocks = 9, 3, 64, 16, 6
    config = type("Config", (), {"rope_parameters": {"rope_theta": 10000.0}})()
    cos, sin = rope.rotary_tables(config, "", hd, torch.bfloat16, 128)
    positions, slots = torch.tensor([0, 7, 63, 100]), torch.tensor([3, 17, 30, 81])
    qkv = torch.randn(4, (nh + 2 * nkv) * hd).bfloat16()
    shape = (nkv, num_blocks, bs, hd)
    plain = [torch.zeros(shape, dtype=torch.bfloat16) for _ in range(2)]
    tiles = [torch.zeros(shape, dtype=torch.bfloat16) for _ in range(2)]
    rows = qkv.clone()
    kernels.rope_store(rows, cos, sin, positions, *plain, slots, nh)
    kernels.rope_store(qkv, cos, sin, positions, *tiles, slots, nh, kv_layout.KV_TILES)
    assert torch.equal(rows, qkv)  # the same rotation in place
    expected = to_tiles(*plain)
    assert torch.equal(tiles[0], expected[0])
    assert torch.equal(tiles[1], expected[1])


def test_the_tile_layout_refuses_shapes_it_has_no_kernel_for() -> None:
    q, k = torch.randn(1, 3, 128).bfloat16(), torch.randn(1, 2, 16, 128).bfloat16()
    tables, lens = torch.tensor([[1]]), torch.tensor([4])
    with pytest.raises(RuntimeError, match="tile layout needs"):
        kernels.paged_decode_attention(q, k, k, tables, lens, 0.1, None, kv_layout.KV_TILES)
    q, k = torch.randn(1, 3, 64), torch.randn(1, 2, 16, 64)
    with pytest.raises(RuntimeError, match="tile layout needs"):
        kernels.paged_decode_attention(q, k, k, tables, lens, 0.1, None, kv_layout.KV_TILES)


@pytest.mark.parametrize(
    ("env", "dtype", "head_dim", "block_size", "group", "expected"),
    [
        ({}, torch.bfloat16, 64, 16, 3, kv_layout.KV_TILES),
        ({}, torch.bfloat16, 64, 32, 1, kv_layout.KV_TILES),
        ({"MODELYARD_KV_TILES": "0"}, torch.bfloat16, 64, 16, 3, kv_layout.KV_PLAIN),
        ({"MODELYARD_PREFILL_SDPA": "1"}, torch.bfloat16, 64, 16, 3, kv_layout.KV_PLAIN),
        ({}, torch.float32, 64, 16, 3, kv_layout.KV_PLAIN),
        ({}, torch.bfloat16, 128, 16, 3, kv_layout.KV_PLAIN),
        ({}, torch.bfloat16, 64, 8, 3, kv_layout.KV_PLAIN),
        ({}, torch.bfloat16, 64, 16, 5, kv_layout.KV_PLAIN),
    ],
)
def test_kv_layout_takes_tiles_only_where_the_kernel_reads_them(
    env: dict[str, str],
    dtype: torch.dtype,
    head_dim: int,
    block_size: int,
    group: int,
    expected: int,
) -> None:
    config = KernelConfig.from_env(env)
    assert kv_layout.kv_layout(dtype, head_dim, block_size, group, config) == expected


def test_kv_tiles_switch_rejects_other_values() -> None:
    with pytest.raises(ValueError, match="MODELYARD_KV_TILES"):
        KernelConfig.from_env({"MODELYARD_KV_TILES": "yes"})
