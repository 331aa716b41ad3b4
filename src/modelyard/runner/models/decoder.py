"""The native decoder-only forward over a paged KV cache, for every family of runner.models.arch
(Llama, Qwen2, Mistral, Qwen3, Gemma 3, Phi-3 / Phi-4-mini).

All new tokens of a step are flattened into one (T, hidden) tensor, so each weight is one
matmul per step for the whole batch; only attention looks at requests (runner.attention).
q/k/v are one weight and gate/up another (runner.models.layers), and in float32 every weight
is packed once for the runner's GEMM (runner.linear). The lm_head runs only on the rows that
are sampled. Weights come from a `WeightSource` (runner.weights) by their HF names.

Two paths compute a layer:
- the fused path, for Llama-like models (`Arch.llama_like`) in float32 / bfloat16 with the
  compiled kernels: each layer's element-wise steps in single kernel calls (RMSNorm, RoPE +
  cache write, add + RMSNorm), and whole decode steps in one compiled loop (runner.decode_loop);
- the torch-ops path (`_layer`) for everything else: q/k norms, partial rotary, Gemma's norms
  and GeGLU, per-layer sliding windows and rope tables. Attention is the same paged attention.

With a LoRAConfig, each layer's projections are wrapped by runner.lora.hooks, which add the
step's adapter deltas row by row (the MLP's activation after its gate/up deltas); a step without
adapters runs the same kernels as a model without LoRA. LoRA needs separate SwiGLU projections
(not Gemma's GeGLU, Phi-3's fused weights nor MoE experts).
"""

from __future__ import annotations

from typing import Any

import torch

from modelyard.engine.config import LoRAConfig
from modelyard.runner import kernels
from modelyard.runner.attention import AttentionMetadata, paged_attention, store_kv
from modelyard.runner.decode_loop import DecodeLoop, LoopShape
from modelyard.runner.kernel_config import KernelConfig
from modelyard.runner.kv_layout import KV_PLAIN, kv_layout
from modelyard.runner.linear import packing_available
from modelyard.runner.lora.adapter import BaseShapes
from modelyard.runner.lora.manager import LoRAManager
from modelyard.runner.models.arch import MOE_ARCHITECTURES, read_arch
from modelyard.runner.models.layers import (
    Build,
    LayerWeights,
    Projection,
    build_layer,
    embedding,
    head,
    norm_weight,
)
from modelyard.runner.models.rope import rotary_tables, rotate
from modelyard.runner.weights import WeightSource


class DecoderModel:
    """Weights, rotary tables and KV cache of one native model; `forward` runs a step."""

    def __init__(
        self,
        source: WeightSource,
        architecture: str,
        config: Any,
        *,
        dtype: torch.dtype,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        kernel_config: KernelConfig,
        lora: LoRAConfig | None = None,
    ) -> None:
        """`source`: the weights by HF name; `architecture`/`config`: a pair `native_supports`
        accepts; `kernel_config`: the runner's kernel switches (packing, KV layout, attention,
        decode loop), its kernels loaded (`kernels.load`)."""
        self.config = config
        self.dtype = dtype
        self.kernel_config = kernel_config
        # build or load the kernels now, not inside the first step (one library per process)
        loaded = kernels.load(kernel_config)
        arch = read_arch(architecture, config, has_lm_head="lm_head.weight" in source.names())
        self.arch = arch
        self.num_heads, self.num_kv_heads = arch.num_heads, arch.num_kv_heads
        self.head_dim, self.eps, self.scale = arch.head_dim, arch.eps, arch.attn_scale
        self.block_size = block_size
        self.sliding_window: int | None = arch.step_window  # what a step's metadata is built with
        hooks_fit = arch.activation == "silu" and not arch.fused_gate_up
        if lora is not None and (not hooks_fit or architecture in MOE_ARCHITECTURES):
            raise ValueError(f"LoRA adapters are not supported for {architecture}")
        self.embed, table = embedding(source, dtype)  # ids (T,) -> (T, H)
        self.norm = norm_weight(source.tensor("model.norm.weight"), arch, dtype)  # (H,)
        build = Build(dtype, packing_available(dtype, kernel_config), kernel_config)
        self.lora = LoRAManager(lora, BaseShapes.of(config), dtype) if lora is not None else None
        self.lm_head: Projection = head(source, table, arch.tied, build)  # H -> V
        self.layers = [
            build_layer(source, arch, config, i, build, self.lora) for i in range(arch.num_layers)
        ]
        self.tables = {
            key: rotary_tables(config, key, self.head_dim, dtype, max_model_len)
            for key in set(arch.rope_keys)
        }  # table key -> cos, signed sin (P, rd) each
        self.cos, self.signed_sin = self.tables[arch.rope_keys[0]]
        # float32 and bfloat16 run the fused ops
        native_dtype = dtype in (torch.float32, torch.bfloat16)
        full_rotary = self.cos.shape[1] == self.head_dim
        self.fused = native_dtype and loaded and arch.llama_like and full_rotary
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
        (runner.decode_loop; fused models only); a view with fewer layers builds its own."""
        dense = [(w.qkv, w.o, w.mlp_in, w.down) for w in self.layers]
        projections = [(q, o, m, d) for q, o, m, d in dense if m is not None and d is not None]
        if len(projections) < len(dense):
            return None  # MoE layers: per-layer calls
        return DecodeLoop.build(
            projections,
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
        """input_ids (T,) flat new tokens -> logits (S, V) for the rows in sample_rows (S,).
        `meta` is built with `self.sliding_window`."""
        x = self.embed(input_ids)  # (T, H)
        if self.arch.embed_scale is not None:  # HF: the scale cast to the dtype, then times
            x = x * torch.tensor(self.arch.embed_scale).to(x.dtype)
        x = self._fused_layers(x, meta) if self.fused else self._torch_layers(x, meta)
        x = self._norm(x.index_select(0, sample_rows), self.norm)  # (S, H)
        logits = self.lm_head(x)  # (S, V)
        cap = self.arch.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return kernels.rms_norm(x, weight, self.eps)
        return rms_norm(x, weight, self.eps, offset=self.arch.norm_offset)

    def _torch_layers(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Every layer in torch ops, each with its window's metadata and its rope table."""
        rope = {
            key: tuple(t.index_select(0, meta.positions).unsqueeze(1) for t in table)
            for key, table in self.tables.items()
        }  # key -> cos, signed sin (T, 1, rd)
        metas = {w: meta.with_window(w) for w in set(self.arch.windows)}
        for i, layer in enumerate(self.layers):
            cos, sin = rope[self.arch.rope_keys[i]]
            x = self._layer(x, layer, i, (cos, sin), metas[self.arch.windows[i]])
        return x

    def _layer(
        self,
        x: torch.Tensor,
        w: LayerWeights,
        index: int,
        rope: tuple[torch.Tensor, ...],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """One decoder layer in torch ops: x (T, H) -> (T, H); rope: cos, signed sin
        (T, 1, rd)."""
        t = x.shape[0]
        nh, nkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        offset = self.arch.norm_offset
        qkv = w.qkv(rms_norm(x, w.input_norm, self.eps, offset=offset))
        q = qkv[:, : nh * hd].view(t, nh, hd)
        k = qkv[:, nh * hd : (nh + nkv) * hd].view(t, nkv, hd)
        v = qkv[:, (nh + nkv) * hd :].view(t, nkv, hd)
        if w.q_norm is not None and w.k_norm is not None:
            q = rms_norm(q, w.q_norm, self.eps, offset=offset)
            k = rms_norm(k, w.k_norm, self.eps, offset=offset)
        q, k = rotate(q, *rope), rotate(k, *rope)  # (T, nh, hd), (T, nkv, hd)
        k_cache, v_cache = self.k_cache[index], self.v_cache[index]
        store_kv(k, v, k_cache, v_cache, meta)
        attn = paged_attention(
            q, k, v, k_cache, v_cache, meta, self.scale,
            prefill_sdpa=self.kernel_config.prefill_sdpa,
        )  # fmt: skip  # (T, nh, hd)
        out = w.o(attn.reshape(t, nh * hd))
        if w.attn_out_norm is not None:
            out = rms_norm(out, w.attn_out_norm, self.eps, offset=offset)
        x = x + out
        mlp = w.mlp(rms_norm(x, w.post_norm, self.eps, offset=offset))
        if w.mlp_out_norm is not None:
            mlp = rms_norm(mlp, w.mlp_out_norm, self.eps, offset=offset)
        return x + mlp  # (T, H)

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
            mlp = w.mlp(h)
            if i + 1 < len(self.layers):
                h = kernels.add_rms_norm(x, mlp, self.layers[i + 1].input_norm, self.eps)
            else:
                x.add_(mlp)
        return x


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, offset: bool) -> torch.Tensor:
    """RMSNorm over the last dim, normalised in float32. HF Llama (offset False): cast back,
    then times the weight. Gemma (offset True): times `weight` = 1 + w in float32, then cast."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (xf * weight).to(x.dtype)
    return weight * xf.to(x.dtype)
