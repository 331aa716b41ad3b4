"""Rotary position tables, computed once at load: cos and signed sin per position.

A model has one table, or one per layer type when its `rope_parameters` are keyed by layer
type (Gemma 3: "sliding_attention" and "full_attention" with their own theta and scaling). The
inverse frequencies are transformers' own (`ROPE_INIT_FUNCTIONS`: linear, llama3, yarn,
longrope; default computed here as HF does); a table covers the first `rotary_dim` channels of
a head (partial rotary: Phi-4-mini rotates 3/4), the rest pass through.

longrope (Phi-3, Phi-4-mini) has two sets of frequencies: here position p uses the short
factors when p < original_max_position_embeddings and the long ones beyond, and a cached key
keeps the factors of its own position. transformers' rotary embedding picks one set per forward
from the forward's longest position (tested equal to this table position by position), so the
two agree while every forward stays on one side: a prompt within the original length and its
continuation up to it. They differ past it: a forward crossing the boundary rotates all of its
positions with the long factors in transformers, and Phi-3's `generate` re-encodes the whole
sequence with them once it first grows past the original length (it drops its cache), which
this engine does not do (earlier keys keep the short factors).
"""

from __future__ import annotations

from typing import Any

import torch

_STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn", "longrope"})


def rope_key(config: Any, layer_type: str) -> str:
    """The table a layer of `layer_type` uses: the layer type where `rope_parameters` are keyed
    by it, else "" (the model's one table)."""
    params = getattr(config, "rope_parameters", None) or {}
    return layer_type if isinstance(params.get(layer_type), dict) else ""


def rope_params(config: Any, key: str) -> dict[str, Any]:
    """The rope parameters of table `key` (rope_key)."""
    params = getattr(config, "rope_parameters", None) or {}
    return dict(params[key] if key else params)


def supported_rope(config: Any, key: str) -> bool:
    """True when table `key` is static (no dynamic NTK rescaling at run time)."""
    return str(rope_params(config, key).get("rope_type", "default")) in _STATIC_ROPE_TYPES


def rotary_tables(
    config: Any, key: str, head_dim: int, dtype: torch.dtype, max_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin (max_len, rotary_dim) of table `key` (see `rotate`)."""
    positions = torch.arange(max_len, dtype=torch.float)
    params = rope_params(config, key)
    rope_type = str(params.get("rope_type", "default"))
    if rope_type == "default":
        inv_freq, scaling = _default_inv_freq(config, params, head_dim), 1.0
        freqs = torch.outer(positions, inv_freq)  # (P, rd/2)
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        init = ROPE_INIT_FUNCTIONS[rope_type]
        layer_type = key or None
        inv_freq, scaling = init(config, None, layer_type=layer_type)
        freqs = torch.outer(positions, inv_freq.float())
        if rope_type == "longrope":
            original = int(params["original_max_position_embeddings"])
            long_freq, _ = init(config, None, seq_len=original + 1, layer_type=layer_type)
            long = torch.outer(positions, long_freq.float())
            freqs = torch.where((positions < original).unsqueeze(1), freqs, long)
    emb = torch.cat((freqs, freqs), dim=-1)  # (P, rd)
    half = emb.shape[1] // 2
    sin = (emb.sin() * scaling).to(dtype)
    sin[:, :half].neg_()
    return (emb.cos() * scaling).to(dtype), sin


def _default_inv_freq(config: Any, params: dict[str, Any], head_dim: int) -> torch.Tensor:
    """HF's default rope: 1 / theta ** (2i / dim) over dim = head_dim * partial_rotary_factor."""
    theta = float(params.get("rope_theta", 10000.0))
    factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    dim = int(head_dim * float(factor if factor is not None else 1.0))
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of the first rd channels: x (T, heads, hd), cos/signed_sin (T, 1, rd).

    signed_sin is sin with its first half negated, so `cat(x2, x1) * signed_sin` equals HF's
    `cat(-x2, x1) * sin` exactly (negation is exact) with one op less. Channels past rd pass
    through (partial rotary).
    """
    rd = cos.shape[-1]
    if rd < x.shape[-1]:
        return torch.cat((rotate(x[..., :rd], cos, signed_sin), x[..., rd:]), dim=-1)
    half = rd // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return x * cos + swapped * signed_sin
