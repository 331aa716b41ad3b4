"""What route handlers program against to reach a model: `ModelProvider.lease(name)`.

The manager (manager/manager.py) is the real provider: it resolves a name or alias through the
catalog, loads on demand (single-flight), keeps the model from eviction while the lease is held,
and evicts idle LRU models to stay inside its byte budget. Tests use small in-process providers.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from modelyard.engine.client.protocol import LLMClient
from modelyard.model_spec import ModelKind, ModelSpec


class ModelNotFoundError(LookupError):
    """No model, alias or name matches (HTTP 404)."""


class ModelLoadError(RuntimeError):
    """The model failed to load (HTTP 503 with the reason; retried later with backoff)."""


class RequestFailedError(RuntimeError):
    """The model failed on this request (its batch-mates were not affected): HTTP 500."""


class ModelUnavailableError(RuntimeError):
    """No memory could be freed in time, or the model's worker died (HTTP 503 + Retry-After)."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Predictor(Protocol):
    """A loaded non-LLM model seen from the API process (its worker runs a dynamic batcher)."""

    async def predict(self, inputs: Any, options: dict[str, Any] | None = None) -> Any:
        """Run one request's inputs (a list of items of the model's kind); the shape of the
        result is fixed per kind (see backends/base.py)."""
        ...


class Lease(Protocol):
    """A model in use: it cannot be evicted until the context manager exits."""

    @property
    def model_id(self) -> str: ...

    @property
    def kind(self) -> ModelKind: ...

    @property
    def llm(self) -> LLMClient:
        """The engine client; raises TypeError for non-LLM kinds."""
        ...

    @property
    def predictor(self) -> Predictor:
        """The batcher client; raises TypeError for LLM kinds."""
        ...

    @property
    def metadata(self) -> dict[str, Any]:
        """KServe-style tensor metadata `{"inputs": [...], "outputs": [...]}` ({} for LLMs)."""
        ...


class ModelProvider(Protocol):
    def lease(self, name: str) -> AbstractAsyncContextManager[Lease]:
        """Resolve name (id, name or alias), load if needed, and hold the model while in use.
        Raises ModelNotFoundError, ModelLoadError or ModelUnavailableError on entry."""
        ...

    def spec(self, name: str) -> ModelSpec:
        """The catalog entry a name (id, name or alias) means; ModelNotFoundError if none."""
        ...

    def describe(self) -> dict[str, Any]:
        """The /models listing: available and loaded models with state and memory."""
        ...

    async def close(self) -> None:
        """Stop every worker (used on shutdown)."""
        ...
