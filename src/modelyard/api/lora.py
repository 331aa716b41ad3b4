"""Checks of a LoRA adapter folder before the admin API registers it (api/routes/lora.py).

An adapter is an entry of the model provider (manager/adapters.py). Its folder is never a
client's choice outside the admin calls, and there `check_adapter` keeps it under
`server.lora_root` (when set) and reads it as the engine will before it is registered.
"""

from __future__ import annotations

from pathlib import Path

from modelyard.cache_dir import DEFAULT_CACHE_DIR
from modelyard.engine.messages import LoRARequest
from modelyard.manager.base import ModelLoadError
from modelyard.model_spec import ModelSpec


def check_adapter(name: str, path: str, root: str | None, base: ModelSpec, max_rank: int) -> Path:
    """The folder `path` names, resolved (symlinks and `..`), once it is known to lie under
    `root` (server.lora_root, when set) and to hold an adapter that fits the base model, read as
    the engine will (runner.lora.adapter). ValueError naming what is wrong; ModelLoadError when
    the base's own config cannot be read. Blocking: run it in a thread."""
    import torch

    from modelyard.runner.loader import resolve_model
    from modelyard.runner.lora.adapter import BaseShapes, adapter_files, read_adapter

    folder = adapter_folder(path, root)
    adapter_files(folder, name)  # before the base: a folder without them is the request's fault
    try:
        # where the engine finds the base's GGUF conversion: its engine config's cache_dir
        cache_root = base.llm.model.cache_dir if base.llm is not None else DEFAULT_CACHE_DIR
        config = resolve_model(base.source, cache_root).config
    except (ValueError, OSError) as exc:
        raise ModelLoadError(f"{base.id}: its config cannot be read: {exc}") from exc
    lora = LoRARequest(name=name, path=str(folder), adapter_id=0)
    read_adapter(lora, BaseShapes.of(config), max_rank, torch.float32)
    return folder


def adapter_folder(path: str, root: str | None) -> Path:
    """`path` resolved; with a `root`, the folder and its adapter files must resolve inside it
    (ValueError otherwise)."""
    from modelyard.runner.lora.adapter import ADAPTER_FILES

    if not path:
        raise ValueError("lora_path must not be empty")
    try:
        folder = Path(path).resolve()
        inside = root is None or all(
            file.resolve().is_relative_to(Path(root).resolve())
            for file in (folder, *(folder / name for name in ADAPTER_FILES))
        )
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL byte...
        raise ValueError(f"lora_path {path!r} cannot be resolved: {exc}") from exc
    if not inside:
        raise ValueError(f"lora_path {path!r} lies outside the server's lora_root {root!r}")
    return folder
