"""A `.gguf` file as a `WeightSource`: its tensors by Hugging Face checkpoint name, read in place.

Names: for each architecture, the HF checkpoint names its models have (`_LAYER`, `_EXPERTS`) are
mapped to the file's tensor names by gguf-py's `TensorNameMap`, as llama.cpp's converter maps
them the other way; a name is offered when the file holds its tensor. Experts, which the file
keeps as one 3-D tensor per projection (`blk.N.ffn_gate_exps`: (E, out, in)), are offered per
expert under the checkpoint's names (`...block_sparse_moe.experts.{e}.w1.weight` for Mixtral,
`...mlp.experts.{e}.gate_proj.weight` for Qwen3-MoE).

The converter's transforms are undone as transformers' GGUF loader undoes them
(`modeling_gguf_pytorch_utils`): arch `llama` q/k weights have their rows un-permuted
(gguf_weights.unpermute_rows); Gemma's norm weights, stored +1, get 1 subtracted; a file
without `output.weight` ties lm_head to the embedding (no "lm_head.weight" name).

`tensor(name)` dequantizes that one tensor (gguf.quants.dequantize) or copies it as stored
(F32 / F16 / BF16). `blocks(name)` returns a 2-D weight's blocks when a kernel reads its type:
numpy views on the file's memory map (the q/k of llama files: their rows gathered into a copy).
Opening reads the header only (runner.gguf_file).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from modelyard.runner.gguf_file import GGUFFile, GGUFTensor
from modelyard.runner.gguf_weights import Blocks, kind_of, unpermute_rows

_ATTN = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
_MLP = ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
_NORMS = ["input_layernorm", "post_attention_layernorm"]
_QK_NORMS = ["self_attn.q_norm", "self_attn.k_norm"]
_GEMMA = [*_NORMS, *_ATTN, *_MLP, "pre_feedforward_layernorm", "post_feedforward_layernorm"]
# gguf arch -> the HF checkpoint names of layer {i} (without .weight / .bias)
_LAYER: dict[str, list[str]] = {
    "llama": [*_NORMS, *_ATTN, *_MLP, "block_sparse_moe.gate"],
    "qwen2": [*_NORMS, *_ATTN, *_MLP],
    "qwen3": [*_NORMS, *_ATTN, *_MLP, *_QK_NORMS],
    "qwen3moe": [*_NORMS, *_ATTN, *_QK_NORMS, "mlp.gate"],
    "gemma2": _GEMMA,
    "gemma3": [*_GEMMA, *_QK_NORMS],
    "phi3": [*_NORMS, "self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", *_MLP[2:]],
}
# gguf arch -> the merged expert names TensorNameMap knows (per expert: ".experts.{e}.")
_EXPERTS: dict[str, list[str]] = {
    "llama": [f"block_sparse_moe.experts.w{j}" for j in (1, 2, 3)],
    "qwen3moe": [f"mlp.experts.{p}_proj" for p in ("gate", "up", "down")],
}
_GLOBAL = ["model.embed_tokens", "model.norm", "lm_head"]


@dataclass(frozen=True, slots=True)
class _Entry:
    """Where one HF weight lives in the file and what undoes the converter's transform."""

    tensor: GGUFTensor
    expert: int | None  # index into a 3-D expert tensor's first axis, or None
    heads: int  # > 0: un-permute the rows of a llama q/k weight over this many heads
    minus_one: bool  # a Gemma norm weight, stored +1


class GGUFSource:
    """The weights of a GGUF file by HF name (implements runner.weights.WeightSource)."""

    def __init__(self, path: Path, config: Any, *, use_blocks: bool) -> None:
        """`config`: the model's transformers config (runner.gguf_config); `use_blocks`: offer
        quantized blocks (`blocks`) for the weights a kernel reads."""
        self.file = GGUFFile(path)
        self._use_blocks = use_blocks
        self._entries = _entries(self.file, config)

    def names(self) -> frozenset[str]:
        return frozenset(self._entries)

    def tensor(self, name: str) -> torch.Tensor:
        entry = self._entries[name]
        out = _float(entry.tensor, _data(entry))  # (out, in) for a weight
        if entry.heads:
            out = out[torch.from_numpy(unpermute_rows(out.shape[0], entry.heads))]
        return out - 1 if entry.minus_one else out

    def release(self) -> None:
        self.file.release_pages()

    def blocks(self, name: str) -> Blocks | None:
        entry = self._entries[name]
        kind = kind_of(entry.tensor.type.name)
        raw = _data(entry)
        if not self._use_blocks or kind is None or raw.ndim != 2:
            return None
        if entry.heads:
            raw = raw[unpermute_rows(raw.shape[0], entry.heads)]  # a copy in HF row order
        return Blocks(kind, raw, entry.tensor.ne[0])  # type: ignore[arg-type]


def _data(entry: _Entry) -> npt.NDArray[np.generic]:
    data = entry.tensor.data
    return data if entry.expert is None else data[entry.expert]


def _float(tensor: GGUFTensor, data: npt.NDArray[np.generic]) -> torch.Tensor:
    """A float tensor of the stored values: F32 / F16 / BF16 copied, other types dequantized."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    kind = tensor.type
    if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return torch.from_numpy(np.array(data))
    if kind == GGMLQuantizationType.BF16:
        return torch.from_numpy(np.array(data).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(dequantize(data, kind))


def _entries(file: GGUFFile, config: Any) -> dict[str, _Entry]:
    """HF name -> entry, for every weight of the file's architecture that the file holds."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = file.architecture
    if arch not in _LAYER:
        raise ValueError(f"GGUF architecture {arch!r} is not supported: {file.path}")
    model_arch = next(a for a, n in MODEL_ARCH_NAMES.items() if n == arch)
    layers = int(config.num_hidden_layers)
    names = get_tensor_name_map(model_arch, layers)
    heads = _permute_heads(arch, config)
    gemma = arch in ("gemma2", "gemma3")
    out: dict[str, _Entry] = {}
    candidates = [*_GLOBAL, *(f"model.layers.{i}.{n}" for i in range(layers) for n in _LAYER[arch])]
    for hf in candidates:
        gguf_name = names.get_name(hf)
        for suffix in (".weight", ".bias"):
            tensor = file.tensors.get(f"{gguf_name}{suffix}") if gguf_name else None
            if tensor is None:
                continue
            key = hf + suffix
            minus_one = gemma and key.endswith("norm.weight")
            out[key] = _Entry(tensor, None, heads.get(key.split(".", 3)[-1], 0), minus_one)
    out.update(_expert_entries(file, arch, layers, names))
    return out


def _permute_heads(arch: str, config: Any) -> dict[str, int]:
    """Layer weight name -> heads to un-permute its rows over (llama-arch q and k only)."""
    if arch != "llama":
        return {}
    q_heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or q_heads)
    return {"self_attn.q_proj.weight": q_heads, "self_attn.k_proj.weight": kv_heads}


def _expert_entries(file: GGUFFile, arch: str, layers: int, names: Any) -> dict[str, _Entry]:
    out: dict[str, _Entry] = {}
    for i in range(layers):
        for merged in _EXPERTS.get(arch, []):
            gguf_name = names.get_name(f"model.layers.{i}.{merged}")
            tensor = file.tensors.get(f"{gguf_name}.weight") if gguf_name else None
            if tensor is None:
                continue
            for e in range(tensor.shape[0]):  # (E, out, in)
                hf = f"model.layers.{i}.{merged.replace('.experts.', f'.experts.{e}.')}.weight"
                out[hf] = _Entry(tensor, e, 0, False)
    return out
