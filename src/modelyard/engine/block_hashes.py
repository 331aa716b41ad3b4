"""The prefix-cache hash chain, the one rule both sides of the engine apply to a prompt.

A full KV block's hash is a 128-bit digest of its parent's hash and its token ids, so a hash
names the whole prefix up to the end of that block. The first block's parent is the request's
cache salt (its LoRA adapter and its `cache_salt`): requests of different adapters or salts
never share KV. The worker keys its prefix cache by these hashes (engine/core/kv_cache.py); the
API process computes the same chain to count a pinned prefix's blocks before it asks the worker
(engine/client/prefixes.py).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from modelyard.engine.messages import LoRARequest

BlockHash = bytes
"""Hash of one full KV block: a digest of (parent block's hash, the block's token ids)."""


def hash_block_tokens(parent_hash: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """The hash of one full block: a 128-bit digest of the parent's hash and its token ids."""
    digest = hashlib.blake2b(parent_hash or b"", digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


def prefix_cache_salt(lora: LoRARequest | None, cache_salt: str | None) -> bytes | None:
    """The parent hash of a request's first KV block (None: unsalted, shared with every
    request that starts alike). The adapter part keeps its pre-salt form, so adapter-only
    hashes do not change."""
    parts = [] if lora is None else [f"lora:{lora.adapter_id}:{lora.name}"]
    if cache_salt is not None:
        parts.append(f"salt:{len(cache_salt)}:{cache_salt}")
    return "\n".join(parts).encode() if parts else None


def block_hashes_of(
    token_ids: list[int], block_size: int, cache_salt: str | None = None
) -> list[BlockHash]:
    """The prefix-cache hashes of the full blocks of `token_ids` for a request without adapter
    and with this `cache_salt`."""
    hashes: list[BlockHash] = []
    salt = prefix_cache_salt(None, cache_salt)
    for index in range(len(token_ids) // block_size):
        parent = hashes[-1] if hashes else salt
        chunk = token_ids[index * block_size : (index + 1) * block_size]
        hashes.append(hash_block_tokens(parent, chunk))
    return hashes
