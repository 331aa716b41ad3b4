"""What route handlers program against to reach a model: `ModelProvider` and its `Lease`.

The manager (manager/manager.py) is the provider locally: it resolves a name or alias through
the catalog, loads on demand (single-flight), keeps the model from eviction while the lease is
held, and evicts idle LRU models to stay inside its byte budget. On Ray the ingress's provider is
scale/provider.py. Both resolve LoRA adapters as entries of their own (manager/adapters.py).
Tests use small in-process providers (tests/fakes/models.py).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from modelyard.engine.client.protocol import LLMClient
from modelyard.engine.messages import LoRARequest, SchedulerStats
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


@dataclass(frozen=True, slots=True)
class Lease:
    """A model in use, as every provider hands it out: the model cannot be evicted until the
    provider's context manager exits."""

    model_id: str  # catalog id of the serving model (an adapter's own name for an adapter)
    kind: ModelKind  # the entry's kind (an adapter's is its base's)
    client: LLMClient | Predictor  # the engine client (LLM kinds) or the batcher client
    metadata: dict[str, Any] = field(default_factory=dict)  # KServe tensor metadata; {} for LLMs

    @property
    def llm(self) -> LLMClient:
        """The engine client; TypeError for non-LLM kinds."""
        if not self.kind.is_llm:
            raise TypeError(f"{self.model_id} is a {self.kind} model, not an LLM")
        return cast(LLMClient, self.client)

    @property
    def predictor(self) -> Predictor:
        """The batcher client; TypeError for LLM kinds."""
        if self.kind.is_llm:
            raise TypeError(f"{self.model_id} is an LLM; use lease.llm")
        return cast(Predictor, self.client)


@dataclass(frozen=True, slots=True)
class Adapter:
    """A LoRA adapter registered with a provider: an entry of its own, served by its base."""

    base: str  # the base model's catalog id
    lora: LoRARequest  # name, folder and registration id, as the engine receives them

    @property
    def name(self) -> str:
        return self.lora.name


class ModelProvider(Protocol):
    """Everything a route or the app reaches a model through (manager.Manager locally,
    scale.provider.RayProvider on Ray, in-process fakes in tests). A name is a catalog id, name
    or alias, or a registered adapter's name."""

    @property
    def ready(self) -> bool:
        """True once `start` has finished (preloads done); KServe's readiness."""
        ...

    async def start(self) -> None:
        """Load what must be loaded at startup; then `ready`."""
        ...

    async def close(self) -> None:
        """Stop every worker (used on shutdown)."""
        ...

    def lease(self, name: str) -> AbstractAsyncContextManager[Lease]:
        """Resolve name, load if needed, and hold the model while in use. An adapter's lease
        holds its base; its engine client runs every request with the adapter.
        Raises ModelNotFoundError, ModelLoadError or ModelUnavailableError on entry, and
        MissingCapabilityError for an adapter whose base engine serves no LoRA."""
        ...

    def spec(self, name: str) -> ModelSpec:
        """The entry a name means (an adapter's: its base's, under the adapter's name);
        ModelNotFoundError if none."""
        ...

    def catalog_entries(self) -> list[ModelSpec]:
        """Every catalog entry (adapters not included), in catalog order."""
        ...

    def state(self, name: str) -> str:
        """One of loaded, loading, unloaded, failed (ModelNotFoundError if unknown); an
        adapter's is its base's."""
        ...

    def metadata(self, name: str) -> dict[str, Any] | None:
        """A loaded model's tensor metadata; None while it is not loaded."""
        ...

    async def load(self, name: str) -> None:
        """Load a model now (the repository API); no lease is kept."""
        ...

    async def unload(self, name: str) -> None:
        """Unload a model now (after its leases end)."""
        ...

    def describe(self) -> dict[str, Any]:
        """The /models listing: `available_models`, `loaded_models` (with state and memory),
        `adapters` (`{"id", "parent"}` each), `ready`."""
        ...

    def engine_stats(self) -> dict[str, SchedulerStats]:
        """The latest scheduler snapshot of every loaded LLM this process can see."""
        ...

    def adapters(self) -> list[Adapter]:
        """The registered LoRA adapters, in registration order."""
        ...

    def add_adapter(self, name: str, base: str, folder: str) -> Adapter:
        """Register the adapter in `folder` (already checked) as an entry served by `base`;
        ValueError when the name is taken, ModelNotFoundError for an unknown base."""
        ...

    async def remove_adapter(self, name: str) -> Adapter:
        """Unregister it; a loaded base engine frees its weights. ModelNotFoundError if none."""
        ...
