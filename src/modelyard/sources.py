"""Where model files come from and where derived files go.

A source is a local folder or file, or `package:<python package>/<file inside it>` (the package's
folder is found without importing it). Sources come from the operator's catalog only; nothing a
request sends is ever used as a path.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path


def package_dir(package: str) -> Path:
    """An installed package's folder, found without importing it (some packages import heavy
    dependencies in __init__)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def resolve_source(source: str) -> Path:
    """`package:<pkg>/<file>` or a local path -> an existing path (FileNotFoundError if not)."""
    if source.startswith("package:"):
        package, _, inner = source.removeprefix("package:").partition("/")
        path = package_dir(package) / inner
    else:
        path = Path(os.path.expanduser(source))
    if not path.exists():
        raise FileNotFoundError(f"model source {source!r} not found ({path})")
    return path


def cache_dir(root: str) -> Path:
    """The folder for derived files (GGUF conversions under `converted/`, ONNX exports) that a
    config names (`ModelConfig.cache_dir`, `OnnxOptions.cache_dir`: modelyard.cache_dir), made
    if missing."""
    path = Path(os.path.expanduser(root))
    path.mkdir(parents=True, exist_ok=True)
    return path


def has_chat_template(path: Path) -> bool:
    """Whether the model at `path` (a .gguf file or a HF folder) comes with a chat template."""
    if path.is_file():
        from modelyard.runner.gguf_file import GGUFFile

        return "tokenizer.chat_template" in GGUFFile(path).metadata
    config = path / "tokenizer_config.json"
    in_config = config.is_file() and "chat_template" in json.loads(config.read_text("utf-8"))
    return in_config or (path / "chat_template.jinja").is_file()
