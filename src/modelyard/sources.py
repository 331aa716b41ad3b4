"""Where model files come from and where derived files go.

A source is a local folder or file, `package:<python package>/<file inside it>` (the package's
folder is found without importing it), or `package-assembled:<python package>`: a package that
ships one model file in parts (too large for one package) and exposes `MODEL_NAME` and
`assemble(output_path, overwrite)`; the file is assembled once into the cache folder
(`<cache>/assembled/<package>/<MODEL_NAME>`) by the worker that loads the model, never on the
API's event loop. Sources come from the operator's catalog only; nothing a
request sends is ever used as a path.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any


def package_dir(package: str) -> Path:
    """An installed package's folder, found without importing it (some packages import heavy
    dependencies in __init__)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


ASSEMBLED = "package-assembled:"


def resolve_source(source: str, cache_root: str | None = None) -> Path:
    """`package:<pkg>/<file>`, `package-assembled:<pkg>` or a local path -> an existing path
    (FileNotFoundError if not). An assembled package's file is made in `cache_root` (a config's
    cache_dir); without one, the installed package's folder is returned (to check it exists)."""
    if source.startswith(ASSEMBLED):
        package = source.removeprefix(ASSEMBLED)
        if cache_root is None:
            return package_dir(package)
        return assembled(package, cache_dir(cache_root) / "assembled")
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


def assembled(package: str, folder: Path) -> Path:
    """The model file `package.assemble` puts together from its parts, made once under
    `folder`: assembled beside its destination and renamed into place, so concurrent workers
    never see half a file (the package checks the whole file's sha256)."""
    module: Any = importlib.import_module(package)
    target = folder / package / str(module.MODEL_NAME)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        module.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
