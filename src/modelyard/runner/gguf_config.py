"""A GGUF file's transformers config and tokenizer, read from its metadata.

`gguf_config` is transformers' own reading (`GGUF_CONFIG_MAPPING`: "<arch>.block_count" ->
num_hidden_layers, ...; the tokenizer's special ids) plus what that mapping leaves out, all
derived in `_derived` (the one place), following what llama.cpp assumes when it runs the file:
- every arch: head_dim from attention.key_length; vocab_size from the embedding's rows;
  tie_word_embeddings when there is no output.weight; rope scaling from rope.scaling.*;
- llama files with experts (Mixtral): model_type mixtral, num_local_experts, num_experts_per_tok;
- qwen3moe: moe_intermediate_size from expert_feed_forward_length;
- gemma2 / gemma3: layer_types from the sliding-window pattern (attention.sliding_window_pattern
  when the file has it, else llama.cpp's: every 2nd (gemma2) / 6th (gemma3) layer global),
  query_pre_attn_scalar (llama.cpp: hidden / heads for the 27B models, else head_dim),
  rope_local_base_freq 10000 for gemma3's local layers, gemma2's logit soft-capping.

`save_tokenizer` writes the tokenizer transformers builds from the file (`gguf_file=`), with
`tokenizer.chat_template` from the metadata when the file has one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelyard.runner.gguf_file import GGUFFile, MetaValue

# gguf arch -> (key of transformers' GGUF_CONFIG_MAPPING, model_type, architecture class)
ARCHITECTURES: dict[str, tuple[str, str, str]] = {
    "llama": ("llama", "llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "qwen3", "Qwen3ForCausalLM"),
    "qwen3moe": ("qwen3_moe", "qwen3_moe", "Qwen3MoeForCausalLM"),
    "gemma2": ("gemma2", "gemma2", "Gemma2ForCausalLM"),
    "gemma3": ("gemma3", "gemma3_text", "Gemma3ForCausalLM"),
    "phi3": ("phi3", "phi3", "Phi3ForCausalLM"),
}
_SLIDING_PERIOD = {
    "gemma2": 2,
    "gemma3": 6,
}  # llama.cpp's swa pattern: layer i global iff (i+1) % p == 0
_LARGE_GEMMA_LAYERS = {"gemma2": 46, "gemma3": 62}  # the 27B models (llama.cpp's LLM_TYPE_27B)


def gguf_config(file: GGUFFile) -> Any:
    """The transformers PretrainedConfig of the model in `file` (ValueError: unsupported arch)."""
    from transformers import AutoConfig

    values = config_values(file)
    return AutoConfig.for_model(values.pop("model_type"), **values)


def config_values(file: GGUFFile) -> dict[str, Any]:
    """The config's fields (with model_type and architectures) read from the file's metadata."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    mappings: dict[str, dict[str, Any]] = GGUF_CONFIG_MAPPING  # type: ignore[assignment]
    arch = file.architecture
    if arch not in ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported: {file.path}")
    key, model_type, class_name = ARCHITECTURES[arch]
    values: dict[str, Any] = {"model_type": model_type, "architectures": [class_name]}
    sections: dict[str, dict[str, Any]] = {
        arch: mappings[key],
        "tokenizer": mappings["tokenizer"],
    }
    for prefix, mapping in sections.items():
        for suffix, field in mapping.items():
            value = file.metadata.get(f"{prefix}.{suffix}")
            if field is not None and field != -1 and value is not None:
                values[field] = value
    values.update(_derived(file, arch, values))
    return values


def _derived(file: GGUFFile, arch: str, values: dict[str, Any]) -> dict[str, Any]:
    """The fields transformers' mapping leaves out (the module docstring lists them)."""
    meta = file.metadata
    out: dict[str, Any] = {
        "vocab_size": file.tensors["token_embd.weight"].shape[0],
        "tie_word_embeddings": "output.weight" not in file.tensors,
    }
    if f"{arch}.attention.key_length" in meta:
        out["head_dim"] = meta[f"{arch}.attention.key_length"]
    scaling = _rope_scaling(meta, arch)
    experts = int(_number(meta.get(f"{arch}.expert_count", 0)))
    if arch == "llama" and experts:
        out["model_type"], out["architectures"] = "mixtral", ["MixtralForCausalLM"]
        out["num_local_experts"] = experts
        out["num_experts_per_tok"] = meta[f"{arch}.expert_used_count"]
    if arch == "qwen3moe" and f"{arch}.expert_feed_forward_length" in meta:
        out["moe_intermediate_size"] = meta[f"{arch}.expert_feed_forward_length"]
    if arch in _SLIDING_PERIOD:
        out.update(_gemma(meta, arch, {**values, **out}))
        if scaling is not None and arch == "gemma3":  # scaled: the global layers only
            out["rope_parameters"] = _gemma3_rope(values, scaling)
            scaling = None
    if scaling is not None:
        out["rope_scaling"] = scaling
    return out


def _gemma(meta: dict[str, MetaValue], arch: str, values: dict[str, Any]) -> dict[str, Any]:
    layers = int(values["num_hidden_layers"])
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list) and len(pattern) == layers:  # per layer: True = sliding
        sliding = [bool(p) for p in pattern]
    else:
        period = int(pattern) if isinstance(pattern, int) else _SLIDING_PERIOD[arch]
        sliding = [(i + 1) % period != 0 for i in range(layers)]
    head_dim = int(values.get("head_dim") or values["hidden_size"] // values["num_attention_heads"])
    large = layers == _LARGE_GEMMA_LAYERS[arch]
    scalar = values["hidden_size"] // values["num_attention_heads"] if large else head_dim
    out: dict[str, Any] = {
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "query_pre_attn_scalar": scalar,
        "hidden_activation": "gelu_pytorch_tanh",
    }
    if arch == "gemma3":
        out["rope_local_base_freq"] = 10_000.0
    for cap in ("attn_logit_softcapping", "final_logit_softcapping"):
        if f"{arch}.{cap}" in meta:
            out[cap] = meta[f"{arch}.{cap}"]
    return out


def _rope_scaling(meta: dict[str, MetaValue], arch: str) -> dict[str, Any] | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    if not isinstance(kind, str) or kind == "none":
        return None
    scaling: dict[str, Any] = {"rope_type": kind, "factor": meta[f"{arch}.rope.scaling.factor"]}
    original = meta.get(f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = original
    return scaling


def _gemma3_rope(values: dict[str, Any], scaling: dict[str, Any]) -> dict[str, Any]:
    full = {**scaling, "rope_theta": values.get("rope_theta", 1_000_000.0)}
    return {
        "full_attention": full,
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    }


def _number(value: MetaValue | None) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def save_tokenizer(path: Path, file: GGUFFile, out: Path) -> None:
    """Save the tokenizer transformers builds from the GGUF file at `path` into `out`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    template = file.metadata.get("tokenizer.chat_template")
    if isinstance(template, str):
        tokenizer.chat_template = template
    tokenizer.save_pretrained(str(out))
