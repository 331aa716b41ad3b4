"""Backends: what a worker process runs for one non-LLM model.

`BACKENDS` is the one place that maps a catalog entry's `backend` to an implementation, as
"module:factory" (imported lazily, so the API process never imports torch or onnxruntime for
them). The API process resolves the name (`backend_target`) and hands the target to the worker,
which builds it (`create_backend`); so a backend registered at run time with `register_backend`
(the tests' `echo` backend) reaches worker processes too. A backend's catalog options parse into
its dataclass in `backends.options.BACKEND_OPTIONS`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from modelyard.backends.base import Backend
from modelyard.backends.options import BACKEND_OPTIONS, NoOptions

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
}


def register_backend(name: str, target: str, options: type = NoOptions) -> None:
    """Make `name` usable in catalogs; `target` is "module:factory" (importable by workers),
    `options` the frozen dataclass its entries' catalog options parse into."""
    if ":" not in target:
        raise ValueError(f"backend target must be 'module:factory', got {target!r}")
    BACKENDS[name] = target
    BACKEND_OPTIONS[name] = options


def backend_target(spec: ModelSpec) -> str:
    """The "module:factory" of spec.backend (ValueError for an unknown name)."""
    target = BACKENDS.get(spec.backend)
    if target is None:
        raise ValueError(f"{spec.id}: unknown backend {spec.backend!r} (known: {sorted(BACKENDS)})")
    return target


def create_backend(spec: ModelSpec, target: str | None = None) -> Backend:
    """Build the backend of `target` (default: spec.backend's) for spec."""
    module_name, _, attr = (target or backend_target(spec)).partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    backend: Backend = factory(spec)
    return backend


__all__ = ["BACKENDS", "Backend", "backend_target", "create_backend", "register_backend"]
