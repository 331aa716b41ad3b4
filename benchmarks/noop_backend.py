"""The multimodel benchmark's no-op model: an embedding backend with no weights that loads at
once, so what is measured is the manager and the request path, not a model. Worker processes
import it as `noop_backend` (benchmarks/ is on the sys.path they inherit)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from modelyard.backends import register_backend
from modelyard.backends.base import TEXT_METADATA, Output, embedding_outputs, require_text
from modelyard.model_spec import ModelSpec


class NoopBackend:
    """Text -> `[len(text), number of words]`."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec

    def load(self) -> None:
        pass

    def preprocess(self, item: Any, options: dict[str, Any]) -> Any:
        return require_text(item)

    def infer(self, items: Sequence[Any], options: dict[str, Any]) -> list[Output]:
        vectors = [[float(len(text)), float(len(text.split()))] for text in items]
        return embedding_outputs(vectors, [len(text) for text in items], options)

    def metadata(self) -> dict[str, Any]:
        return {**TEXT_METADATA, "outputs": []}

    def close(self) -> None:
        pass


def register_noop() -> None:
    """Make `backend: noop` usable in this process's catalogs (and its workers)."""
    register_backend("noop", "noop_backend:NoopBackend")
