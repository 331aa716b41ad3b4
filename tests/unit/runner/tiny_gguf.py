"""Tiny random checkpoints written into GGUF files as llama.cpp's convert_hf_to_gguf writes them:
tensor names by gguf-py's TensorNameMap, llama-arch q/k rows permuted, Gemma norms stored +1,
experts stacked into one 3-D tensor per projection, the metadata keys of each architecture."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import MODEL_ARCH_NAMES, GGMLQuantizationType, GGUFWriter, get_tensor_name_map, quants

H, NH, NKV, HD, INTER, VOCAB, LAYERS, EXPERTS = 32, 4, 2, 8, 64, 64, 2, 3


@dataclass(frozen=True)
class Spec:
    """One architecture: its HF config and checkpoint layout."""

    arch: str  # gguf general.architecture
    config: dict[str, Any]  # fields of the HF config (model_type included)
    layer: dict[str, tuple[int, ...]]  # HF layer weight name -> shape
    experts: dict[str, tuple[int, ...]]  # HF per-expert name ("...experts.{e}.w1") -> shape
    tied: bool


def _attn(bias: bool = False) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {
        "self_attn.q_proj.weight": (NH * HD, H),
        "self_attn.k_proj.weight": (NKV * HD, H),
        "self_attn.v_proj.weight": (NKV * HD, H),
        "self_attn.o_proj.weight": (H, NH * HD),
    }
    if bias:
        out |= {
            f"self_attn.{p}_proj.bias": (n * HD,) for p, n in (("q", NH), ("k", NKV), ("v", NKV))
        }
    return out


NORMS = {"input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,)}
QK_NORMS = {"self_attn.q_norm.weight": (HD,), "self_attn.k_norm.weight": (HD,)}
MLP = {
    "mlp.gate_proj.weight": (INTER, H),
    "mlp.up_proj.weight": (INTER, H),
    "mlp.down_proj.weight": (H, INTER),
}
GEMMA_NORMS = {"pre_feedforward_layernorm.weight": (H,), "post_feedforward_layernorm.weight": (H,)}
BASE = {
    "hidden_size": H,
    "num_attention_heads": NH,
    "num_key_value_heads": NKV,
    "head_dim": HD,
    "intermediate_size": INTER,
    "vocab_size": VOCAB,
    "num_hidden_layers": LAYERS,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
}

SPECS = {
    "llama": Spec("llama", {"model_type": "llama", **BASE}, NORMS | _attn() | MLP, {}, False),
    "mixtral": Spec(
        "llama",
        {"model_type": "mixtral", **BASE, "num_local_experts": EXPERTS, "num_experts_per_tok": 2},
        NORMS | _attn() | {"block_sparse_moe.gate.weight": (EXPERTS, H)},
        {
            "block_sparse_moe.experts.{e}.w1.weight": (INTER, H),
            "block_sparse_moe.experts.{e}.w2.weight": (H, INTER),
            "block_sparse_moe.experts.{e}.w3.weight": (INTER, H),
        },
        False,
    ),
    "qwen2": Spec("qwen2", {"model_type": "qwen2", **BASE}, NORMS | _attn(True) | MLP, {}, True),
    "qwen3": Spec(
        "qwen3", {"model_type": "qwen3", **BASE}, NORMS | _attn() | QK_NORMS | MLP, {}, True
    ),
    "qwen3moe": Spec(
        "qwen3moe",
        {
            "model_type": "qwen3_moe",
            **BASE,
            "num_experts": EXPERTS,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": INTER,
        },
        NORMS | _attn() | QK_NORMS | {"mlp.gate.weight": (EXPERTS, H)},
        {
            f"mlp.experts.{{e}}.{p}_proj.weight": s
            for p, s in (("gate", (INTER, H)), ("up", (INTER, H)), ("down", (H, INTER)))
        },
        False,
    ),
    "gemma2": Spec(
        "gemma2",
        {"model_type": "gemma2", **BASE, "sliding_window": 16},
        NORMS | GEMMA_NORMS | _attn() | MLP,
        {},
        True,
    ),
    "gemma3": Spec(
        "gemma3",
        {"model_type": "gemma3_text", **BASE, "sliding_window": 16, "num_hidden_layers": 6},
        NORMS | GEMMA_NORMS | _attn() | QK_NORMS | MLP,
        {},
        True,
    ),
    "phi3": Spec(
        "phi3",
        {"model_type": "phi3", **BASE, "num_key_value_heads": NH},
        NORMS
        | {
            "self_attn.qkv_proj.weight": (3 * NH * HD, H),
            "self_attn.o_proj.weight": (H, NH * HD),
            "mlp.gate_up_proj.weight": (2 * INTER, H),
            "mlp.down_proj.weight": (H, INTER),
        },
        {},
        False,
    ),
}


def checkpoint(spec: Spec, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float32 weights under the HF checkpoint names of `spec`."""
    gen = torch.Generator().manual_seed(seed)
    layers = spec.config["num_hidden_layers"]
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (VOCAB, H),
        "model.norm.weight": (H,),
    }
    if not spec.tied:
        shapes["lm_head.weight"] = (VOCAB, H)
    for i in range(layers):
        shapes |= {f"model.layers.{i}.{n}": s for n, s in spec.layer.items()}
        for n, s in spec.experts.items():
            shapes |= {f"model.layers.{i}.{n.format(e=e)}": s for e in range(EXPERTS)}
    return {n: torch.randn(s, generator=gen) * 0.1 for n, s in shapes.items()}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute (q and k rows for its rotary layout)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def gguf_tensors(spec: Spec, state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The converter's tensors: GGUF name -> float32 array."""
    arch = next(a for a, n in MODEL_ARCH_NAMES.items() if n == spec.arch)
    names = get_tensor_name_map(arch, spec.config["num_hidden_layers"])
    out: dict[str, np.ndarray] = {}
    for hf, tensor in state.items():
        if ".experts." in hf:
            continue
        w = tensor.numpy()
        if spec.arch == "llama" and hf.endswith("q_proj.weight"):
            w = _permute(w, NH)
        if spec.arch == "llama" and hf.endswith("k_proj.weight"):
            w = _permute(w, NKV)
        if spec.arch.startswith("gemma") and hf.endswith("norm.weight"):
            w = w + 1
        out[names.get_name(hf, try_suffixes=(".weight", ".bias"))] = w
    for i in range(spec.config["num_hidden_layers"]):
        for n in spec.experts:
            merged = f"model.layers.{i}.{n.replace('.{e}', '')}"
            stacked = np.stack(
                [state[f"model.layers.{i}.{n.format(e=e)}"].numpy() for e in range(EXPERTS)]
            )
            out[names.get_name(merged, try_suffixes=(".weight",))] = stacked
    return out


def write(
    spec: Spec,
    tensors: dict[str, np.ndarray],
    path: Path,
    quantized: dict[str, GGMLQuantizationType],
) -> Path:
    """Write `tensors` (float32, or quantized to `quantized[name]`) with `spec`'s metadata."""
    c = spec.config
    writer = GGUFWriter(str(path), spec.arch)
    writer.add_block_count(c["num_hidden_layers"])
    writer.add_context_length(c["max_position_embeddings"])
    writer.add_embedding_length(H)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(NH)
    writer.add_head_count_kv(c["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(c["rms_norm_eps"])
    writer.add_rope_freq_base(c["rope_theta"])
    writer.add_key_length(HD)
    writer.add_value_length(HD)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if spec.experts:
        writer.add_expert_count(EXPERTS)
        writer.add_expert_used_count(2)
    if spec.arch == "qwen3moe":
        writer.add_expert_feed_forward_length(INTER)
    if "sliding_window" in c:
        writer.add_sliding_window(c["sliding_window"])
    for name, w in tensors.items():
        qtype = quantized.get(name)
        if qtype is None:
            writer.add_tensor(name, w.astype(np.float32))
        else:
            writer.add_tensor(name, quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
