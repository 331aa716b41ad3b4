"""Backends: what a worker process runs for one non-LLM model. `create_backend(spec)` is the one
place that maps a catalog entry's `backend` to an implementation (imported lazily, so the API
process never imports torch or onnxruntime for them)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from modelyard.backends.base import Backend

if TYPE_CHECKING:
    from modelyard.model_spec import ModelSpec

# backend name -> "module:factory"; each factory takes the ModelSpec and returns a Backend.
BACKENDS: dict[str, str] = {
    "embeddings": "modelyard.backends.text:EmbeddingBackend",
    "zero-shot": "modelyard.backends.text:ZeroShotBackend",
    "transformers": "modelyard.backends.text:SequenceClassifierBackend",
    "text-classification": "modelyard.backends.text:SequenceClassifierBackend",
    "efficientnet": "modelyard.backends.image:EfficientNetBackend",
    "torchvision": "modelyard.backends.image:TorchvisionBackend",
    "onnx": "modelyard.backends.onnx:OnnxBackend",
    "triton": "modelyard.backends.triton:TritonBackend",
    "echo": "modelyard.backends.echo:EchoBackend",
}


def create_backend(spec: ModelSpec) -> Backend:
    """The backend for spec.backend (ValueError for an unknown name)."""
    target = BACKENDS.get(spec.backend)
    if target is None:
        raise ValueError(f"{spec.id}: unknown backend {spec.backend!r} (known: {sorted(BACKENDS)})")
    module_name, _, attr = target.partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    backend: Backend = factory(spec)
    return backend


__all__ = ["BACKENDS", "Backend", "create_backend"]
