"""The layout of a model's KV cache inside each (block_size, head_dim) block of a KV head.

KV_PLAIN: one row per key. KV_TILES: K as (hd / 2, bs, 2), the pairs of head dims of each key
side by side, and V as (bs / 2, hd, 2), the values of each pair of keys side by side: the B
operands of AMX tile multiplies, which decode attention reads in place (csrc/decode_tiles.cpp,
`decode_tiles`; `kernels.rope_store` writes either layout). The cache tensors keep their
(nkv, NB, bs, hd) shape either way; only the compiled kernels read or write the tile layout.
"""

from __future__ import annotations

import torch

from modelyard.runner import kernels
from modelyard.runner.kernel_config import KernelConfig

KV_PLAIN, KV_TILES = 0, 1


def kv_layout(
    dtype: torch.dtype, head_dim: int, block_size: int, group: int, config: KernelConfig
) -> int:
    """The layout a model's KV cache takes here: KV_TILES for bfloat16, head size 64, blocks a
    multiple of 16 and 1-4 query heads per KV head (`group`) where AMX tiles run and neither
    `MODELYARD_KV_TILES=0` nor `MODELYARD_PREFILL_SDPA=1` (SDPA reads plain rows) is set; else
    KV_PLAIN."""
    shapes = dtype == torch.bfloat16 and head_dim == 64 and block_size % 16 == 0
    wanted = config.kv_tiles and not config.prefill_sdpa and shapes and 1 <= group <= 4
    return KV_TILES if wanted and kernels.amx_ready() else KV_PLAIN
