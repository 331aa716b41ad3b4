"""Native Llama-family forward over a paged KV cache (Llama, SmolLM2, Qwen2, Mistral).

All new tokens of a step are flattened into one (T, hidden) tensor, so each weight is one
matmul per step for the whole batch; only attention looks at requests (runner.attention).
q/k/v are fused into one weight and gate/up into another at load time, and in float32 every
weight is packed once for the runner's GEMM (runner.linear), which applies SwiGLU's activation
to the gate/up tiles as it makes them. The lm_head runs only on the rows that are
sampled. Weights come straight from the HF safetensors files.

With a LoRAConfig, each layer's projections are wrapped by runner.lora.hooks, which add the
step's adapter deltas row by row (the MLP's activation after its gate/up deltas); a step without
adapters runs the same kernels as a model without LoRA.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from modelyard.engine.config import LoRAConfig
from modelyard.runner import kernels
from modelyard.runner.attention import AttentionMetadata, paged_attention, store_kv
from modelyard.runner.decode_loop import DecodeLoop, LoopShape
from modelyard.runner.gguf_weights import GGUFLinear, GGUFSwiGLU, GGUFWeights, concat
from modelyard.runner.kernel_config import KernelConfig
from modelyard.runner.kv_layout import KV_PLAIN, kv_layout
from modelyard.runner.linear import Linear, SwiGLU, packing_available
from modelyard.runner.lora.adapter import BaseShapes
from modelyard.runner.lora.hooks import LoRAGatedMLP, LoRAProjection
from modelyard.runner.lora.manager import LoRAManager
from modelyard.runner.weights import WeightSource

Projection = Callable[[torch.Tensor], torch.Tensor]
log = logging.getLogger(__name__)

NATIVE_ARCHITECTURES = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"})
_STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})


def native_supports(architecture: str, config: Any) -> bool:
    """True when LlamaModel can run this architecture/config exactly."""
    if architecture not in NATIVE_ARCHITECTURES:
        return False
    if getattr(config, "mlp_bias", False) or getattr(config, "hidden_act", "silu") != "silu":
        return False
    return _rope_type(config) in _STATIC_ROPE_TYPES


def _rope_type(config: Any) -> str:
    params = getattr(config, "rope_parameters", None) or {}
    return str(params.get("rope_type", "default"))


@dataclass(slots=True)
class LayerWeights:
    """One decoder layer; shapes with H = hidden, nh/nkv heads, hd head dim, I = intermediate."""

    input_norm: torch.Tensor  # (H,)
    qkv: Projection  # H -> (nh + 2 * nkv) * hd, with bias for Qwen2 / Llama attention_bias
    o: Projection  # nh * hd -> H, with bias for Llama attention_bias
    post_norm: torch.Tensor  # (H,)
    mlp_in: Projection  # H -> I: silu(gate) * up
    down: Projection  # I -> H


class LlamaModel:
    """Weights, rotary tables and KV cache of one Llama-family model; `forward` runs a step."""

    def __init__(
        self,
        source: WeightSource,
        config: Any,
        *,
        dtype: torch.dtype,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        kernel_config: KernelConfig,
        lora: LoRAConfig | None = None,
        gguf: Path | None = None,
    ) -> None:
        """`source`: the weights by HF name (runner.weights); `kernel_config`: the runner's
        kernel switches (packing, KV layout, attention, decode loop), its kernels loaded
        (`kernels.load`); `gguf`: the GGUF file `source` reads, to keep its quantized blocks
        for the linear layers (runner.gguf_weights; not with LoRA)."""
        self.config = config
        self.dtype = dtype
        self.kernel_config = kernel_config
        # build or load the kernels now, not inside the first step (one library per process)
        loaded = kernels.load(kernel_config)
        self.num_heads: int = config.num_attention_heads
        self.num_kv_heads: int = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim: int = getattr(config, "head_dim", None) or (
            config.hidden_size // self.num_heads
        )
        self.eps: float = config.rms_norm_eps
        self.scale = self.head_dim**-0.5
        self.block_size = block_size
        self.sliding_window: int | None = _sliding_window(config)
        state = {n: source.tensor(n) for n in source.names()}
        self.embed = state["model.embed_tokens.weight"].to(dtype)  # (V, H)
        self.norm = state["model.norm.weight"].to(dtype)  # (H,)
        head = state.get("lm_head.weight")
        tied = getattr(config, "tie_word_embeddings", False) or head is None
        head_weight = self.embed if tied or head is None else head.to(dtype)
        pack = packing_available(dtype, kernel_config)
        self.lora = LoRAManager(lora, BaseShapes.of(config), dtype) if lora is not None else None
        blocks = _gguf_blocks(gguf, config, self.lora)
        # H -> V; packing a tied head makes its own copy, the embedding table stays for lookups
        head_blocks = blocks.lm_head() if blocks is not None else None
        self.lm_head: Projection = (
            GGUFLinear(head_blocks, None)
            if head_blocks is not None
            else Linear(head_weight, None, pack=pack, kernel_config=kernel_config)
        )
        self.layers = [
            _layer(state, i, dtype, (pack, kernel_config), self.lora, blocks)
            for i in range(config.num_hidden_layers)
        ]
        del state
        tables = _rotary_tables(config, self.head_dim, dtype, max_model_len)
        self.cos, self.signed_sin = tables  # (P, hd) each
        # float32 and bfloat16 run the fused ops
        native_dtype = dtype in (torch.float32, torch.bfloat16)
        self.fused = native_dtype and loaded and self.head_dim % 2 == 0
        group = self.num_heads // self.num_kv_heads
        self.kv_layout = (
            kv_layout(dtype, self.head_dim, block_size, group, kernel_config)
            if self.fused
            else KV_PLAIN
        )  # the caches' layout inside each block: only the fused path's kernels read tiles
        shape = (self.num_kv_heads, num_blocks, block_size, self.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=dtype) for _ in self.layers]
        self.v_cache = [torch.zeros(shape, dtype=dtype) for _ in self.layers]
        self.loop = self.decode_loop() if self.fused else None

    def decode_loop(self) -> DecodeLoop | None:
        """Every layer of `self.layers` in one compiled call where the weights allow it
        (runner.decode_loop); a view with fewer layers builds its own."""
        return DecodeLoop.build(
            [(w.qkv, w.o, w.mlp_in, w.down) for w in self.layers],
            [(w.input_norm, w.post_norm) for w in self.layers],
            (self.k_cache, self.v_cache),
            LoopShape(
                num_heads=self.num_heads,
                head_dim=self.head_dim,
                eps=self.eps,
                scale=self.scale,
                layout=self.kv_layout,
                prefill_sdpa=self.kernel_config.prefill_sdpa,
            ),
            self.kernel_config,
        )

    @staticmethod
    def kv_bytes_per_block(config: Any, dtype: torch.dtype, block_size: int) -> int:
        """Bytes of K+V for one block across all layers."""
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        elem = torch.empty((), dtype=dtype).element_size()
        return int(2 * config.num_hidden_layers * block_size * kv_heads * head_dim * elem)

    def forward(
        self, input_ids: torch.Tensor, meta: AttentionMetadata, sample_rows: torch.Tensor
    ) -> torch.Tensor:
        """input_ids (T,) flat new tokens -> logits (S, V) for the rows in sample_rows (S,)."""
        x = self.embed.index_select(0, input_ids)  # (T, H)
        if self.fused:
            x = self._fused_layers(x, meta)
        else:
            cos = self.cos.index_select(0, meta.positions).unsqueeze(1)  # (T, 1, hd)
            sin = self.signed_sin.index_select(0, meta.positions).unsqueeze(1)
            for i, layer in enumerate(self.layers):
                x = self._layer(x, layer, i, cos, sin, meta)
        x = self._norm(x.index_select(0, sample_rows), self.norm)  # (S, H)
        return self.lm_head(x)  # (S, V)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return kernels.rms_norm(x, weight, self.eps)
        return _rms_norm(x, weight, self.eps)

    def _layer(
        self,
        x: torch.Tensor,
        w: LayerWeights,
        index: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """One decoder layer in torch ops (bfloat16, or no compiled kernels)."""
        t = x.shape[0]
        nh, nkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = w.qkv(_rms_norm(x, w.input_norm, self.eps))
        qk = _rope(qkv[:, : (nh + nkv) * hd].view(t, nh + nkv, hd), cos, sin)  # (T, nh+nkv, hd)
        q, k = qk[:, :nh], qk[:, nh:]  # (T, nh, hd), (T, nkv, hd)
        v = qkv[:, (nh + nkv) * hd :].view(t, nkv, hd)
        k_cache, v_cache = self.k_cache[index], self.v_cache[index]
        store_kv(k, v, k_cache, v_cache, meta)
        attn = paged_attention(
            q,
            k,
            v,
            k_cache,
            v_cache,
            meta,
            self.scale,
            prefill_sdpa=self.kernel_config.prefill_sdpa,
        )  # (T, nh, hd)
        x = x + w.o(attn.view(t, nh * hd))
        return x + w.down(w.mlp_in(_rms_norm(x, w.post_norm, self.eps)))  # (T, H)

    def _fused_layers(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Every decoder layer with the compiled element-wise ops: the same math as `_layer`, one
        pass per step instead of several torch ops (bf16: the same bits). x (T, H) is the
        residual stream, updated in place; each layer's last add is fused with the next layer's
        norm. Steps the compiled loop covers run these calls from C++ (runner.decode_loop)."""
        t = x.shape[0]
        if self.loop is not None and self.loop.covers(meta, t, x.dtype):
            self.loop.run(x, meta, self.cos, self.signed_sin)
            return x
        nh, nkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        h = kernels.rms_norm(x, self.layers[0].input_norm, self.eps)
        for i, w in enumerate(self.layers):
            k_cache, v_cache = self.k_cache[i], self.v_cache[i]
            qkv = w.qkv(h)  # (T, (nh + 2 nkv) hd)
            kernels.rope_store(
                qkv, self.cos, self.signed_sin, meta.positions, k_cache, v_cache,
                meta.slot_mapping, nh, self.kv_layout,
            )  # fmt: skip
            q = qkv[:, : nh * hd].view(t, nh, hd)
            k = qkv[:, nh * hd : (nh + nkv) * hd].view(t, nkv, hd)
            v = qkv[:, (nh + nkv) * hd :].view(t, nkv, hd)
            attn = paged_attention(
                q, k, v, k_cache, v_cache, meta, self.scale, self.kv_layout,
                prefill_sdpa=self.kernel_config.prefill_sdpa,
            )  # fmt: skip
            h = kernels.add_rms_norm(x, w.o(attn.view(t, nh * hd)), w.post_norm, self.eps)
            mlp = w.down(w.mlp_in(h))
            if i + 1 < len(self.layers):
                h = kernels.add_rms_norm(x, mlp, self.layers[i + 1].input_norm, self.eps)
            else:
                x.add_(mlp)
        return x


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm: normalise in fp32, cast back, then scale."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE: x (T, heads, hd), cos/signed_sin (T, 1, hd).

    signed_sin is sin with its first half negated, so `cat(x2, x1) * signed_sin` equals HF's
    `cat(-x2, x1) * sin` exactly (negation is exact) with one op less.
    """
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return x * cos + swapped * signed_sin


def _sliding_window(config: Any) -> int | None:
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types and "sliding_attention" not in layer_types:
        return None
    return int(window)


def _rotary_tables(
    config: Any, head_dim: int, dtype: torch.dtype, max_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin tables (max_len, hd), computed once at load (see `_rope`)."""
    rope_type = _rope_type(config)
    if rope_type == "default":
        theta = float((getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        attention_scaling = 1.0
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](config, None)
    positions = torch.arange(max_len, dtype=torch.float)
    freqs = torch.outer(positions, inv_freq.float())  # (P, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (P, hd)
    sin = (emb.sin() * attention_scaling).to(dtype)
    sin[:, : head_dim // 2].neg_()
    return (emb.cos() * attention_scaling).to(dtype), sin


def _gguf_blocks(gguf: Path | None, config: Any, lora: LoRAManager | None) -> GGUFWeights | None:
    if gguf is None:
        return None
    if lora is not None or not kernels.loaded():
        log.warning("GGUF blocks not used: %s", "LoRA is on" if lora else "no compiled kernels")
        return None
    log.info("linear layers on the quantized blocks of %s", gguf.name)
    return GGUFWeights(gguf, config)


def _layer(
    state: dict[str, torch.Tensor],
    index: int,
    dtype: torch.dtype,
    packing: tuple[bool, KernelConfig],  # packing_available for the dtype, the switches
    lora: LoRAManager | None,
    blocks: GGUFWeights | None = None,
) -> LayerWeights:
    pack, kernel_config = packing
    if blocks is not None:
        quantized = _gguf_layer(state, index, dtype, blocks)
        if quantized is not None:
            return quantized
    prefix = f"model.layers.{index}."

    def get(name: str) -> torch.Tensor:
        return state[prefix + name].to(dtype)

    def maybe(name: str) -> torch.Tensor | None:
        t = state.get(prefix + name)
        return None if t is None else t.to(dtype)

    biases = [maybe(f"self_attn.{p}_proj.bias") for p in ("q", "k", "v")]
    qkv_bias = None
    if any(b is not None for b in biases):
        sizes = [state[f"{prefix}self_attn.{p}_proj.weight"].shape[0] for p in ("q", "k", "v")]
        qkv_bias = torch.cat(
            [
                b if b is not None else torch.zeros(n, dtype=dtype)
                for b, n in zip(biases, sizes, strict=True)
            ]
        )
    qkv_weight = torch.cat([get(f"self_attn.{p}_proj.weight") for p in ("q", "k", "v")])

    def linear(weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
        return Linear(weight, bias, pack=pack, kernel_config=kernel_config)

    qkv = linear(qkv_weight.contiguous(), qkv_bias)
    o = linear(get("self_attn.o_proj.weight"), maybe("self_attn.o_proj.bias"))
    gate, up = get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")
    down = linear(get("mlp.down_proj.weight"), None)
    norms = {"input_norm": get("input_layernorm.weight")}
    norms["post_norm"] = get("post_attention_layernorm.weight")
    if lora is not None:  # the hook: adapter deltas on every projection
        return LayerWeights(
            qkv=LoRAProjection(qkv, lora, index, "qkv"),
            o=LoRAProjection(o, lora, index, "o"),
            mlp_in=LoRAGatedMLP(gate, up, lora, index, pack=pack, kernel_config=kernel_config),
            down=LoRAProjection(down, lora, index, "down"),
            **norms,
        )
    mlp_in = SwiGLU(gate, up, pack=pack, kernel_config=kernel_config)
    return LayerWeights(qkv=qkv, o=o, mlp_in=mlp_in, down=down, **norms)


def _gguf_layer(
    state: dict[str, torch.Tensor], index: int, dtype: torch.dtype, blocks: GGUFWeights
) -> LayerWeights | None:
    """Layer `index` on the GGUF file's blocks (None when one of its weights is of a type the
    kernel does not read, or the layer has biases: then it keeps float32)."""
    prefix = f"model.layers.{index}."
    if any(name.startswith(prefix) and name.endswith(".bias") for name in state):
        return None
    qkv = concat([blocks.layer(index, f"self_attn.{p}_proj") for p in ("q", "k", "v")])
    gate, up = blocks.layer(index, "mlp.gate_proj"), blocks.layer(index, "mlp.up_proj")
    o, down = blocks.layer(index, "self_attn.o_proj"), blocks.layer(index, "mlp.down_proj")
    if qkv is None or gate is None or up is None or o is None or down is None:
        return None
    return LayerWeights(
        input_norm=state[prefix + "input_layernorm.weight"].to(dtype),
        qkv=GGUFLinear(qkv, None),
        o=GGUFLinear(o, None),
        post_norm=state[prefix + "post_attention_layernorm.weight"].to(dtype),
        mlp_in=GGUFSwiGLU(gate, up),
        down=GGUFLinear(down, None),
    )
