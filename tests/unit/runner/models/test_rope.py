"""Rotary tables against transformers' rotary embeddings, position by position."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from modelyard.runner.models.rope import rope_key, rotary_tables, rotate

pytestmark = pytest.mark.unit


def _phi4_mini_like() -> Any:
    from transformers import Phi3Config

    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}
    rope |= {"short_factor": [1.0, 1.2, 1.5, 2.0, 3.0, 4.0], "original_max_position_embeddings": 8}
    rope["long_factor"] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    return Phi3Config(
        vocab_size=32, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=1, partial_rotary_factor=0.75, rope_parameters=rope,
        max_position_embeddings=32, original_max_position_embeddings=8, pad_token_id=0,
    )  # fmt: skip


def test_longrope_short_below_original_long_beyond_partial_rotary() -> None:
    """Each position's cos/sin equal transformers' for a forward whose longest position it is:
    short factors up to original_max_position_embeddings - 1, long ones beyond, 12 of 16
    channels rotated, and the attention scaling of the extended length."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    config = _phi4_mini_like()
    cos, sin = rotary_tables(config, "", 16, torch.float32, 24)
    assert cos.shape == (24, 12)
    hf = Phi3RotaryEmbedding(config)
    for p in range(24):
        hf_cos, hf_sin = hf(torch.zeros(1, 1, 16), torch.tensor([[p]]))
        assert torch.equal(cos[p], hf_cos[0, 0]), p
        assert torch.equal(sin[p, 6:], hf_sin[0, 0, 6:])
        assert torch.equal(sin[p, :6], -hf_sin[0, 0, :6])


def test_gemma3_tables_per_layer_type() -> None:
    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    rope = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
    }
    config = Gemma3TextConfig(
        vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, rope_parameters=rope,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    hf = Gemma3RotaryEmbedding(config)
    positions = torch.arange(20).unsqueeze(0)
    for layer_type in ("sliding_attention", "full_attention"):
        key = rope_key(config, layer_type)
        assert key == layer_type
        cos, _ = rotary_tables(config, key, 32, torch.float32, 20)
        hf_cos, _ = hf(torch.zeros(1, 20, 32), positions, layer_type)
        assert torch.equal(cos, hf_cos[0]), layer_type


def test_rotate_passes_the_channels_past_the_rotary_dim() -> None:
    x = torch.randn(3, 2, 16)
    cos, sin = torch.randn(3, 1, 12), torch.randn(3, 1, 12)
    out = rotate(x, cos, sin)
    assert torch.equal(out[..., 12:], x[..., 12:])
    swapped = torch.cat((x[..., 6:12], x[..., :6]), dim=-1)
    torch.testing.assert_close(out[..., :12], x[..., :12] * cos + swapped * sin)
