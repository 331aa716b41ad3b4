"""What a decoder architecture is, as data: one frozen `Arch` read once from the HF config.

The native decoder (runner.models.decoder) runs every family it supports from this
description: the families differ only in the switches below (norm style, q/k norms, the MLP's
activation, Gemma's sandwich norms, embedding and attention scales, per-layer sliding windows
and rope tables, partial rotary, a final logit softcap, fused checkpoint weights). `ARCHITECTURES`
maps each HF architecture name to its family; `native_supports` refuses any config the decoder
would not compute exactly as transformers does (then the generic path runs).

Families (transformers 5.x modelling code):
- llama: Llama (rope default / linear / llama3 / yarn), Qwen2, Mistral, Mixtral (MoE);
- qwen3: Llama plus RMSNorm over each head's q and k before rope (Qwen3, Qwen3-MoE);
- gemma3: Gemma 3 text: RMSNorm x * (1 + w), q/k norms, query_pre_attn_scalar, norms before
  and after attention and MLP, GeGLU (gelu tanh), embedding scaled by sqrt(hidden), sliding and
  full layers each with its own rope;
- phi3: Phi-3 / Phi-4-mini: fused qkv_proj and gate_up_proj, longrope, partial rotary.
MoE families are native only where runner.models.moe says a layer is MoE (its stub says none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from modelyard.runner.models import moe
from modelyard.runner.models.rope import rope_key, supported_rope

Family = Literal["llama", "qwen3", "gemma3", "phi3"]
Activation = Literal["silu", "gelu_tanh"]

ARCHITECTURES: dict[str, Family] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "MixtralForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
MOE_ARCHITECTURES = frozenset({"MixtralForCausalLM", "Qwen3MoeForCausalLM"})
# where transformers gives each layer the window of its `layer_types` entry; the others (Mistral,
# Mixtral, Phi-3) slide every layer when the config has a window
LAYER_TYPED = frozenset(
    {"Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Gemma3ForCausalLM"}
)
_ACTIVATIONS: dict[str, Activation] = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


@dataclass(frozen=True, kw_only=True)
class Arch:
    """One model's decoder, as the decoder computes it (shapes: H hidden, hd head dim)."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # hd: explicit in the config (Qwen3, Gemma) or H / num_heads
    eps: float  # RMSNorm epsilon
    norm_offset: bool  # Gemma RMSNorm: normalise in float32, times (1 + w), cast back
    qk_norm: bool  # RMSNorm over each head's q and k (hd) before rope
    activation: Activation  # the gated MLP's: silu (SwiGLU) or gelu tanh (GeGLU)
    sandwich_norms: bool  # Gemma: attention output and MLP output normed before the residual
    embed_scale: float | None  # embeddings times this (cast to the dtype first, as HF does)
    attn_scale: float  # q.k scale: hd ** -0.5, Gemma query_pre_attn_scalar ** -0.5
    windows: tuple[int | None, ...]  # per layer: its sliding window, None = full attention
    rope_keys: tuple[str, ...]  # per layer: its rope table (rope.rope_key; "" = the model's one)
    final_softcap: float | None  # logits = cap * tanh(logits / cap)
    fused_qkv: bool  # the checkpoint stores self_attn.qkv_proj (Phi-3)
    fused_gate_up: bool  # the checkpoint stores mlp.gate_up_proj, gate rows first (Phi-3)
    tied: bool  # lm_head is the embedding (config, or no lm_head weight)

    @property
    def llama_like(self) -> bool:
        """True when the compiled fused layer ops and decode loop compute this model: Llama's
        norms and SwiGLU, full rotary of one table, one window for every layer."""
        plain = not (self.norm_offset or self.qk_norm or self.sandwich_norms)
        one_table = len(set(self.rope_keys)) == 1 and len(set(self.windows)) <= 1
        extras = self.embed_scale is None and self.final_softcap is None
        return plain and one_table and extras and self.activation == "silu"

    @property
    def step_window(self) -> int | None:
        """The window a step's attention metadata is built with: the layers' own when they all
        share it, else None (the decoder derives the others per step)."""
        return self.windows[0] if len(set(self.windows)) == 1 else None


def native_supports(architecture: str, config: Any) -> bool:
    """True when the native decoder runs this architecture/config exactly."""
    family = ARCHITECTURES.get(architecture)
    if family is None or getattr(config, "mlp_bias", False):
        return False
    if _activation_name(config, family) not in _ACTIVATIONS:
        return False
    if family == "gemma3" and (
        getattr(config, "attn_logit_softcapping", None) is not None
        or getattr(config, "use_bidirectional_attention", False)
    ):
        return False
    if architecture in MOE_ARCHITECTURES and not any(
        moe.is_moe_layer(config, i) for i in range(config.num_hidden_layers)
    ):
        return False  # MoE layers need runner.models.moe
    layer_types = _layer_types(architecture, config)
    return all(supported_rope(config, rope_key(config, t)) for t in set(layer_types))


def read_arch(architecture: str, config: Any, *, has_lm_head: bool) -> Arch:
    """The description of a supported architecture (`native_supports`) with this config."""
    family = ARCHITECTURES[architecture]
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    gemma = family == "gemma3"
    scalar = getattr(config, "query_pre_attn_scalar", None) if gemma else None
    layer_types = _layer_types(architecture, config)
    return Arch(
        num_layers=int(config.num_hidden_layers),
        num_heads=heads,
        num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=head_dim,
        eps=float(config.rms_norm_eps),
        norm_offset=gemma,
        qk_norm=family in ("qwen3", "gemma3"),
        activation=_ACTIVATIONS[_activation_name(config, family)],
        sandwich_norms=gemma,
        embed_scale=math.sqrt(config.hidden_size) if gemma else None,
        attn_scale=float(scalar if scalar is not None else head_dim) ** -0.5,
        windows=tuple(_window(config, t) for t in layer_types),
        rope_keys=tuple(rope_key(config, t) for t in layer_types),
        final_softcap=getattr(config, "final_logit_softcapping", None) if gemma else None,
        fused_qkv=family == "phi3",
        fused_gate_up=family == "phi3",
        tied=bool(getattr(config, "tie_word_embeddings", False)) or not has_lm_head,
    )


def _activation_name(config: Any, family: Family) -> str:
    if family == "gemma3":
        return str(getattr(config, "hidden_activation", None) or "gelu_pytorch_tanh")
    return str(getattr(config, "hidden_act", "silu"))


def _layer_types(architecture: str, config: Any) -> list[str]:
    """Each layer's attention type ("sliding_attention" | "full_attention"): its `layer_types`
    entry (LAYER_TYPED), else sliding for every layer when the config has a window."""
    types = getattr(config, "layer_types", None)
    if types and architecture in LAYER_TYPED:
        return [str(t) for t in types][: config.num_hidden_layers]
    sliding = getattr(config, "sliding_window", None) is not None
    return ["sliding_attention" if sliding else "full_attention"] * config.num_hidden_layers


def _window(config: Any, layer_type: str) -> int | None:
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window) if layer_type == "sliding_attention" else None
