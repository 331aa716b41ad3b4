"""A dependency-free backend for tests and fault drills: no weights, instant load.

Not in the production registry: tests/conftest.py registers it as `echo` (`register_echo()`,
its catalog options typed as `EchoOptions`); worker processes import it as `fakes.echo` (tests/
is on the sys.path they inherit).

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
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelyard.backends import register_backend
from modelyard.backends.base import (
    TEXT_METADATA,
    Output,
    embedding_outputs,
    ranked,
    require_text,
    top_k_option,
)
from modelyard.backends.options import options_of
from modelyard.backends.tensors import from_numpy, to_numpy
from modelyard.config_parse import check_fields, setting
from modelyard.model_spec import ModelKind, ModelSpec


@dataclass(frozen=True, kw_only=True)
class EchoOptions:
    """The echo backend's catalog options (see the module docstring)."""

    scale: float = 1.0  # tensor kind: outputs are inputs times this
    labels: tuple[str, ...] = ("a", "b")  # classification kinds: default labels
    allocate_bytes: int = setting(0, ge=0)  # memory held while loaded
    load_delay_s: float = setting(0.0, ge=0)  # load() sleeps this long
    fail_load: str = ""  # load() raises with this message ("": loads)
    crash_on: str | None = None  # an input text that makes the worker exit
    fail_on: str | None = None  # an input text that makes its whole batch raise

    def __post_init__(self) -> None:
        check_fields(self)


def register_echo() -> None:
    """Make `backend: echo` usable in catalogs (this process and its workers)."""
    register_backend("echo", "fakes.echo:EchoBackend", EchoOptions)


class EchoBackend:
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.options = options_of(spec, EchoOptions)
        self._ballast: bytearray | None = None

    def load(self) -> None:
        time.sleep(self.options.load_delay_s)
        if self.options.fail_load:
            raise RuntimeError(self.options.fail_load)
        size = self.options.allocate_bytes
        if size:
            self._ballast = bytearray(os.urandom(1024)) * (size // 1024)

    def preprocess(self, item: Any, options: dict[str, Any]) -> Any:
        if self.spec.kind == ModelKind.TENSOR:
            if not isinstance(item, dict) or not item:
                raise ValueError("this model takes named tensors")
            return {name: to_numpy(tensor) for name, tensor in item.items()}
        text = require_text(item)
        if text == self.options.crash_on:
            os._exit(3)
        if self.spec.kind != ModelKind.EMBEDDING:
            top_k_option(options)
        return text

    def infer(self, items: Sequence[Any], options: dict[str, Any]) -> list[Output]:
        poison = self.options.fail_on
        if poison is not None and any(item == poison for item in items):
            raise RuntimeError("the batch holds the fail_on input")
        if self.spec.kind == ModelKind.TENSOR:
            scale = self.options.scale
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
        labels = list(options.get("labels", self.options.labels))
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
