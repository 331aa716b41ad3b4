"""A dependency-free backend for tests and fault drills: no weights, instant load.

Not in the production registry: tests and benchmarks register it as `echo` with
`register_backend("echo", "modelyard.backends.echo:EchoBackend")`.

Per kind: tensor -> each input tensor back, data multiplied by option `scale` (default 1);
embedding -> `[len(text), number of words]`; classification kinds -> labels from option
`labels` ranked by how often their first letter occurs in the text.
Fault options (catalog only): `allocate_bytes` (memory held while loaded, to exercise the
budget), `load_delay_s`, `fail_load` (error message raised by load), `crash_on` (an input text
that makes the worker exit abruptly, to exercise crash handling), `fail_on` (an input text that
passes preprocessing but makes the backend call of its whole batch raise, to exercise the
batcher's isolation).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from modelyard.backends.base import (
    TEXT_METADATA,
    Output,
    embedding_outputs,
    ranked,
    require_text,
    top_k_option,
)
from modelyard.backends.tensors import from_numpy, to_numpy
from modelyard.model_spec import ModelKind, ModelSpec


class EchoBackend:
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._ballast: bytearray | None = None

    def load(self) -> None:
        time.sleep(float(self.spec.options.get("load_delay_s", 0.0)))
        if self.spec.options.get("fail_load"):
            raise RuntimeError(str(self.spec.options["fail_load"]))
        size = int(self.spec.options.get("allocate_bytes", 0))
        if size:
            self._ballast = bytearray(os.urandom(1024)) * (size // 1024)

    def preprocess(self, item: Any, options: dict[str, Any]) -> Any:
        if self.spec.kind == ModelKind.TENSOR:
            if not isinstance(item, dict) or not item:
                raise ValueError("this model takes named tensors")
            return {name: to_numpy(tensor) for name, tensor in item.items()}
        text = require_text(item)
        if text == self.spec.options.get("crash_on"):
            os._exit(3)
        if self.spec.kind != ModelKind.EMBEDDING:
            top_k_option(options)
        return text

    def infer(self, items: Sequence[Any], options: dict[str, Any]) -> list[Output]:
        poison = self.spec.options.get("fail_on")
        if poison is not None and any(item == poison for item in items):
            raise RuntimeError("the batch holds the fail_on input")
        if self.spec.kind == ModelKind.TENSOR:
            scale = float(self.spec.options.get("scale", 1.0))
            return [
                {
                    f"{name}_out": from_numpy(np.asarray(a * scale if a.dtype.kind in "fiu" else a))
                    for name, a in item.items()
                }
                for item in items
            ]
        if self.spec.kind == ModelKind.EMBEDDING:  # the fake's tokens are characters
            vectors = [[float(len(text)), float(len(text.split()))] for text in items]
            return embedding_outputs(vectors, [len(text) for text in items], options)
        labels = list(options.get("labels", self.spec.options.get("labels", ["a", "b"])))
        top_k = top_k_option(options, default=len(labels))
        return [
            ranked([float(text.count(label[:1])) for label in labels], labels, top_k)
            for text in items
        ]

    def metadata(self) -> dict[str, Any]:
        if self.spec.kind == ModelKind.TENSOR:
            return {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
                "outputs": [{"name": "x_out", "datatype": "FP32", "shape": [-1]}],
            }
        return {**TEXT_METADATA, "outputs": []}

    def close(self) -> None:
        self._ballast = None
