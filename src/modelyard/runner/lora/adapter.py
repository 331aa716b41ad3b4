"""A PEFT LoRA folder, read from disk and checked against the base model before any of it is kept.

`read_adapter(lora, shapes, max_rank, dtype)` is the one reader: the API checks an adapter with
it when `POST /v1/load_lora_adapter` registers one (api.lora), and runner.lora.manager's LoRAManager
loads it with it on first use. Every way a folder can be wrong is a ValueError that names the
adapter, the file and what is wrong, raised in this order:

1. the folder holds `adapter_config.json` and `adapter_model.safetensors`;
2. the config is a JSON object whose fields read here have their types (absent or null: PEFT's
   defaults): `peft_type` "LORA", `use_dora` / `fan_in_fan_out` false, `bias` "none",
   `use_rslora` a boolean, `lora_alpha` a finite number, `alpha_pattern` / `rank_pattern`
   objects of numbers (keys valid patterns), `target_modules` a pattern or a list of names of
   supported modules (`MODULES`), no `modules_to_save`;
3. the safetensors header (read alone: a truncated or corrupt file fails here) lists only
   `...layers.<i>.<self_attn|mlp>.<module>.lora_<A|B>.weight` of a supported module in a layer
   the base has, both halves of each, 2-D float tensors A (r, in) and B (out, r) of the base's
   shapes with 1 <= r <= max_rank;
4. then the tensors are read: their values must be finite.

A PEFT adapter adds s * B (A x) to a projection y = W x, s = alpha / r (alpha / sqrt(r) with
use_rslora; alpha_pattern honoured); `Adapter` keeps A and s * B.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from modelyard.engine.messages import LoRARequest

#: the projections an adapter may target -> the part of the layer that holds them
MODULES = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_FILES = (CONFIG_FILE, WEIGHTS_FILE)
_KEY = re.compile(r"(?:.*\.)?layers\.(\d{1,6})\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
_FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})  # safetensors' names


@dataclass(frozen=True)
class BaseShapes:
    """The base model's projection shapes: module -> (in_features, out_features)."""

    num_layers: int
    modules: dict[str, tuple[int, int]]

    @classmethod
    def of(cls, config: Any) -> BaseShapes:
        hidden, heads = config.hidden_size, config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        inter = config.intermediate_size
        modules = {
            "q_proj": (hidden, heads * head_dim),
            "k_proj": (hidden, kv_heads * head_dim),
            "v_proj": (hidden, kv_heads * head_dim),
            "o_proj": (heads * head_dim, hidden),
            "gate_proj": (hidden, inter),
            "up_proj": (hidden, inter),
            "down_proj": (inter, hidden),
        }
        return cls(config.num_hidden_layers, modules)


@dataclass
class Adapter:
    """One adapter in memory: (layer, module) -> (A (r, in), s * B (out, r))."""

    lora: LoRARequest
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    nbytes: int


def read_adapter(
    lora: LoRARequest, shapes: BaseShapes, max_rank: int, dtype: torch.dtype
) -> Adapter:
    """Load a PEFT folder, checked against the base (ValueError naming what does not fit)."""
    config_file, weights_file = adapter_files(Path(lora.path), lora.name)
    config = _read_config(config_file, lora.name)
    tensors = _read_tensors(weights_file, shapes, max_rank, lora.name)
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, module), (a, b) in tensors.items():
        rank = a.shape[0]
        scale = _scaling(config, f"model.layers.{layer}.{MODULES[module]}.{module}", rank)
        weights[(layer, module)] = (a.to(dtype), (b.float() * scale).to(dtype))
    nbytes = sum(a.nbytes + b.nbytes for a, b in weights.values())
    return Adapter(lora, weights, nbytes)


def _refused(name: str, problem: str) -> ValueError:
    return ValueError(f"LoRA adapter {name!r}: {problem}")


def adapter_files(folder: Path, name: str) -> tuple[Path, Path]:
    """The folder's config and weights files, both regular files (step 1)."""
    try:
        if not folder.is_dir():
            wanted = " and ".join(ADAPTER_FILES)
            raise _refused(name, f"no PEFT LoRA folder ({wanted}) at {str(folder)!r}")
        missing = [f for f in ADAPTER_FILES if not (folder / f).is_file()]
    except OSError as exc:  # a name too long, a permission denied...
        raise _refused(name, f"cannot read {str(folder)!r}: {exc.strerror}") from exc
    if missing:
        raise _refused(name, f"no {missing[0]} in {str(folder)!r} (a PEFT LoRA folder holds both)")
    return folder / CONFIG_FILE, folder / WEIGHTS_FILE


# ---------------------------------------------------------------- adapter_config.json (step 2)


def _read_config(path: Path, name: str) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _refused(name, f"{CONFIG_FILE} cannot be read as UTF-8 text: {exc}") from exc
    try:
        config = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _refused(name, f"{CONFIG_FILE} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        kind = type(config).__name__.replace("dict", "object").replace("NoneType", "null")
        raise _refused(name, f"{CONFIG_FILE} must hold a JSON object, not a {kind}")
    _check_config(config, name)
    return config


def _check_config(config: dict[str, Any], name: str) -> None:
    def wrong(field: str, wanted: str) -> ValueError:
        return _refused(name, f"{CONFIG_FILE}: {field} must be {wanted}, not {config[field]!r}")

    def given(field: str) -> bool:
        return config.get(field) is not None

    if config.get("peft_type", "LORA") != "LORA":
        raise wrong("peft_type", '"LORA" (only LoRA adapters are supported)')
    for field in ("use_rslora", "use_dora", "fan_in_fan_out"):
        if given(field) and not isinstance(config[field], bool):
            raise wrong(field, "true or false")
    if config.get("use_dora") or config.get("fan_in_fan_out"):
        raise _refused(name, "only plain LoRA adapters are supported (no DoRA, no fan_in_fan_out)")
    if given("bias") and config["bias"] != "none":
        raise wrong("bias", '"none" (biases are not supported)')
    if given("lora_alpha") and not _is_number(config["lora_alpha"]):
        raise wrong("lora_alpha", "a finite number")
    for field in ("alpha_pattern", "rank_pattern"):
        if given(field) and not _is_pattern_map(config[field]):
            raise wrong(field, "an object of module patterns to numbers")
    if config.get("modules_to_save"):
        raise wrong("modules_to_save", "empty (whole modules in an adapter are not supported)")
    _check_targets(config.get("target_modules"), name)


def _check_targets(targets: object, name: str) -> None:
    """A pattern (matched against module names by PEFT), or names of supported modules."""
    if targets is None or (isinstance(targets, str) and _compiles(targets)):
        return
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise _refused(name, f"{CONFIG_FILE}: target_modules must be a list of module names")
    for target in targets:
        if target.rpartition(".")[2] not in MODULES:
            supported = ", ".join(MODULES)
            raise _refused(name, f"unsupported target module {target!r} (supported: {supported})")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_pattern_map(value: object) -> bool:
    if not isinstance(value, dict):
        return False
    return all(_compiles(k) and _is_number(v) for k, v in value.items())


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


def _scaling(config: dict[str, Any], module_name: str, rank: int) -> float:
    """s for one module; alpha_pattern keys match the end of its name, as in PEFT."""
    given = config.get("lora_alpha")
    alpha = float(rank if given is None else given)
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(?:.*\.)?(?:{pattern})$", module_name):
            alpha = float(value)
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


# ---------------------------------------------------------------- adapter_model.safetensors


def _read_tensors(
    path: Path, shapes: BaseShapes, max_rank: int, name: str
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """(layer, module) -> (A, B), every header entry checked before any tensor is read."""
    try:
        with safe_open(str(path), "pt") as f:
            pairs = _pair_keys(list(f.keys()), shapes.num_layers, name)
            for (layer, module), keys in pairs.items():
                fits = shapes.modules[module]
                _check_pair(f, keys, fits, max_rank, name, f"layer {layer} {module}")
            tensors = {k: (f.get_tensor(a), f.get_tensor(b)) for k, (a, b) in pairs.items()}
    except SafetensorError as exc:
        raise _refused(name, f"{WEIGHTS_FILE} is not a valid safetensors file: {exc}") from exc
    except OSError as exc:
        raise _refused(name, f"{WEIGHTS_FILE} cannot be read: {exc}") from exc
    for (layer, module), (a, b) in tensors.items():
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise _refused(name, f"layer {layer} {module}: NaN or infinite weights")
    return tensors


def _pair_keys(
    keys: list[str], num_layers: int, name: str
) -> dict[tuple[int, str], tuple[str, str]]:
    """The header's tensor names as (layer, module) -> (lora_A's, lora_B's) (step 3)."""
    halves: dict[tuple[int, str], dict[str, str]] = {}
    for key in keys:
        match = _KEY.match(key)
        if match is None or MODULES.get(match.group(3)) != match.group(2):
            supported = ", ".join(MODULES)
            raise _refused(name, f"unsupported tensor {key!r} (LoRA of {supported} only)")
        layer = int(match.group(1))
        if layer >= num_layers:
            raise _refused(name, f"tensor {key!r}: the base has {num_layers} layers")
        halves.setdefault((layer, match.group(3)), {})[match.group(4)] = key
    if not halves:
        raise _refused(name, f"{WEIGHTS_FILE} holds no LoRA tensors")
    for (layer, module), half in halves.items():
        if set(half) != {"A", "B"}:
            raise _refused(name, f"layer {layer} {module} needs both lora_A and lora_B")
    return {k: (h["A"], h["B"]) for k, h in halves.items()}


def _check_pair(
    f: Any, keys: tuple[str, str], fits: tuple[int, int], max_rank: int, name: str, where: str
) -> None:
    """A (r, in) and B (out, r) float tensors for the base's (in, out), 1 <= r <= max_rank."""
    a, b = (f.get_slice(key) for key in keys)
    for key, half in zip(keys, (a, b), strict=True):
        if half.get_dtype() not in _FLOAT_DTYPES:
            raise _refused(name, f"tensor {key!r} is {half.get_dtype()}, not floating point")
    a_shape, b_shape = list(a.get_shape()), list(b.get_shape())
    size_in, size_out = fits
    rank = a_shape[0] if a_shape else 0
    if a_shape != [rank, size_in] or b_shape != [size_out, rank]:
        raise _refused(
            name,
            f"{where} does not fit the base: lora_A {a_shape} and lora_B {b_shape}, where the "
            f"base needs lora_A [r, {size_in}] and lora_B [{size_out}, r]",
        )
    if not 1 <= rank <= max_rank:
        raise _refused(name, f"{where}: rank {rank} is not within 1..max_lora_rank {max_rank}")
