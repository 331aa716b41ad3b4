"""What the native decoder accepts, and how it reads a family from its config."""

from __future__ import annotations

import pytest

from modelyard.runner.models.arch import native_supports, read_arch

pytestmark = pytest.mark.unit

TINY = {"vocab_size": 32, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4}


def test_gemma3_description() -> None:
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(
        **TINY, num_key_value_heads=1, head_dim=256, sliding_window=8, query_pre_attn_scalar=64,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
    )  # fmt: skip
    assert native_supports("Gemma3ForCausalLM", config)
    arch = read_arch("Gemma3ForCausalLM", config, has_lm_head=False)
    assert (arch.norm_offset, arch.qk_norm, arch.sandwich_norms) == (True, True, True)
    assert arch.activation == "gelu_tanh"
    assert arch.head_dim == 256
    assert arch.tied
    assert arch.attn_scale == 64**-0.5
    assert arch.embed_scale == 8.0
    assert arch.windows == (8, 8, 8, None)
    assert arch.step_window is None
    assert arch.rope_keys == ("sliding_attention",) * 3 + ("full_attention",)
    assert not arch.llama_like


def test_llama_family_keeps_the_fused_path() -> None:
    from transformers import MistralConfig, Qwen3Config

    mistral = read_arch(
        "MistralForCausalLM", MistralConfig(**TINY, sliding_window=16), has_lm_head=True
    )
    assert mistral.llama_like
    assert mistral.step_window == 16
    assert not mistral.tied
    qwen3 = read_arch("Qwen3ForCausalLM", Qwen3Config(**TINY, head_dim=32), has_lm_head=True)
    assert qwen3.qk_norm
    assert qwen3.head_dim == 32
    assert not qwen3.llama_like


def test_refusals() -> None:
    from transformers import Gemma3TextConfig, LlamaConfig, MixtralConfig, Qwen3MoeConfig

    dynamic = LlamaConfig(**TINY, rope_parameters={"rope_type": "dynamic", "factor": 2.0})
    assert not native_supports("LlamaForCausalLM", dynamic)
    assert not native_supports("LlamaForCausalLM", LlamaConfig(**TINY, mlp_bias=True))
    assert not native_supports("GPT2LMHeadModel", LlamaConfig(**TINY))
    softcapped = Gemma3TextConfig(**TINY, attn_logit_softcapping=50.0)
    assert not native_supports("Gemma3ForCausalLM", softcapped)
    # mixtures of experts run natively (runner.models.moe)
    assert native_supports("MixtralForCausalLM", MixtralConfig(**TINY))
    assert native_supports("Qwen3MoeForCausalLM", Qwen3MoeConfig(**TINY))
