"""Where derived model files go: GGUF conversions (under `converted/`) and ONNX exports.

The config layer reads `MODELYARD_CACHE_DIR` here, once, when it builds a model's config (the
engine's `ModelConfig.cache_dir`, the ONNX backend's `OnnxOptions.cache_dir`); the worker that
converts or exports is handed the folder with that config (modelyard.sources makes it).
"""

from __future__ import annotations

import os

DEFAULT_CACHE_DIR = "~/.cache/modelyard"


def cache_dir_from_environment() -> str:
    """`MODELYARD_CACHE_DIR`, by default ~/.cache/modelyard (the one place it is read)."""
    return os.environ.get("MODELYARD_CACHE_DIR") or DEFAULT_CACHE_DIR
