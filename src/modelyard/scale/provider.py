"""`RayProvider`: the ingress's `ModelProvider`, over Ray Serve deployment handles.

The ingress runs the same ASGI app as single-node mode; only the provider differs. A lease of an
LLM yields a `RayLLMClient` (tokenizes in the ingress, streams `RequestOutput`s from a replica of
the model's deployment, which the request router picks); a lease of another model yields a
`RayPredictor` (a call to the multiplexed pool with the model id). Errors from Ray come back as
the errors the routes already map: a replica or engine that died -> EngineDeadError (503), Serve's
back-pressure -> EngineOverloadedError (429), the replica's own errors unwrapped.

The session header and X-Request-ID of the HTTP request reach the calls through `CALL_CONTEXT`,
set per request by `SessionContextMiddleware` (outermost ASGI layer of the ingress).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, NoReturn, cast

from modelyard.engine.messages import SchedulerStats
from modelyard.engine.output_processor import check_prompt_length, render_chat
from modelyard.engine.protocol import (
    EngineDeadError,
    EngineOverloadedError,
    PromptTooLongError,
    RequestOutput,
    Tokenizer,
)
from modelyard.engine.sampling_params import SamplingParams
from modelyard.manager.base import ModelLoadError, ModelNotFoundError, ModelUnavailableError
from modelyard.manager.catalog import Catalog
from modelyard.model_spec import ModelKind, ModelSpec
from modelyard.scale.messages import LLMCall, LLMReplicaInfo


@dataclass(frozen=True, slots=True)
class CallContext:
    """Per-HTTP-request values the Ray calls carry."""

    session_id: str | None = None
    request_id: str | None = None


CALL_CONTEXT: ContextVar[CallContext | None] = ContextVar("modelyard_ray_call", default=None)

#: Replica-side errors that keep their type across Ray.
_PASS_THROUGH = (
    EngineDeadError,
    EngineOverloadedError,
    PromptTooLongError,
    ModelNotFoundError,
    ModelLoadError,
    ModelUnavailableError,
    ValueError,
    TypeError,
)


def reraise_local(exc: Exception, *, llm: bool) -> NoReturn:
    """Raise `local_error(exc)` (chained to `exc` when it is another exception)."""
    error = local_error(exc, llm=llm)
    if error is exc:
        raise exc
    raise error from exc


def local_error(exc: BaseException, *, llm: bool) -> BaseException:
    """The error a route handler understands for an exception raised by a Ray call."""
    from ray import exceptions as ray_errors
    from ray.serve import exceptions as serve_errors

    if isinstance(exc, ray_errors.RayTaskError):
        cause = exc.cause
        if isinstance(cause, _PASS_THROUGH):
            return cause
        exc = cause if isinstance(cause, BaseException) else exc
    if isinstance(exc, serve_errors.BackPressureError):
        return EngineOverloadedError(f"all replicas are busy: {exc}", retry_after_s=1.0)
    if isinstance(exc, _PASS_THROUGH):
        return exc
    if isinstance(exc, ray_errors.RayError):
        message = f"replica failed: {type(exc).__name__}: {exc}"
        return EngineDeadError(message) if llm else ModelUnavailableError(message, 5.0)
    return exc


class RayLLMClient:
    """`LLMClient` over an LLM deployment (see the module docstring)."""

    def __init__(self, handle: Any, info: LLMReplicaInfo) -> None:
        self._handle = handle.options(stream=True)
        self._info = info
        self._live: dict[str, Any] = {}  # request id -> the response generator

    @property
    def model_name(self) -> str:
        return self._info.model_id

    @property
    def max_model_len(self) -> int:
        return self._info.max_model_len

    @property
    def tokenizer(self) -> Tokenizer:
        return cast(Tokenizer, self._info.tokenizer)

    @property
    def is_alive(self) -> bool:
        return True  # Serve replaces dead replicas; a failed call raises EngineDeadError

    def apply_chat_template(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return render_chat(self.tokenizer, messages)

    async def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str,
        *,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        params.validate()
        ids = await self._tokenize(prompt)
        check_prompt_length(len(ids), params.max_tokens, self.max_model_len)
        context = CALL_CONTEXT.get() or CallContext()
        call = LLMCall(
            request_id=request_id,
            prompt_token_ids=ids,
            params=params,
            priority=priority,
            session_id=context.session_id,
            client_request_id=context.request_id,
        )
        stream = self._handle.generate.remote(call)
        self._live[request_id] = stream
        finished = False
        try:
            async for output in stream:
                finished = output.finished
                yield output
        except Exception as exc:
            reraise_local(exc, llm=True)
        finally:
            self._live.pop(request_id, None)
            if not finished:
                stream.cancel()

    async def abort(self, request_id: str) -> None:
        stream = self._live.pop(request_id, None)
        if stream is not None:
            stream.cancel()

    def stats(self) -> SchedulerStats:
        """Engine stats live in each replica (Ray's metrics export); none in the ingress."""
        return SchedulerStats()

    async def shutdown(self) -> None:
        for stream in self._live.values():
            stream.cancel()

    async def _tokenize(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = await asyncio.to_thread(self.tokenizer.encode, prompt)
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("prompt must not be empty")
        return ids


class RayPredictor:
    """A non-LLM model of the multiplexed pool."""

    def __init__(self, pool: Any, model_id: str) -> None:
        self._pool = pool.options(multiplexed_model_id=model_id)

    async def predict(self, inputs: Any, options: dict[str, Any] | None = None) -> Any:
        try:
            return await self._pool.predict.remote(inputs, options)
        except Exception as exc:
            reraise_local(exc, llm=False)

    async def call(self, method: str) -> Any:
        try:
            return await getattr(self._pool, method).remote()
        except Exception as exc:
            reraise_local(exc, llm=False)


@dataclass(frozen=True, slots=True)
class RayLease:
    """A model reached through Ray (implements manager.base.Lease)."""

    spec: ModelSpec
    client: RayLLMClient | RayPredictor
    metadata: dict[str, Any]

    @property
    def model_id(self) -> str:
        return self.spec.id

    @property
    def kind(self) -> ModelKind:
        return self.spec.kind

    @property
    def llm(self) -> RayLLMClient:
        if not isinstance(self.client, RayLLMClient):
            raise TypeError(f"{self.spec.id} is a {self.spec.kind} model, not an LLM")
        return self.client

    @property
    def predictor(self) -> RayPredictor:
        if not isinstance(self.client, RayPredictor):
            raise TypeError(f"{self.spec.id} is an LLM; use lease.llm")
        return self.client


class RayProvider:
    """`ModelProvider` of the ingress (see the module docstring)."""

    def __init__(self, catalog: Catalog, llm_handles: Mapping[str, Any], pool: Any) -> None:
        self.catalog = catalog
        self._llm_handles = dict(llm_handles)
        self._pool = pool
        self._llms: dict[str, RayLLMClient] = {}
        self._loaded: set[str] = set()  # pool models this ingress has seen loaded
        self._metadata: dict[str, dict[str, Any]] = {}
        self.ready = False

    async def start(self) -> None:
        """Ask one replica of every LLM for its tokenizer and limits; then ready."""
        for model_id, handle in self._llm_handles.items():
            try:
                info = await handle.describe.remote()
            except Exception as exc:
                reraise_local(exc, llm=True)
            self._llms[model_id] = RayLLMClient(handle, info)
        self.ready = True

    async def close(self) -> None:
        await asyncio.gather(*(llm.shutdown() for llm in self._llms.values()))

    @contextlib.asynccontextmanager
    async def lease(self, name: str) -> AsyncIterator[RayLease]:
        spec = self.catalog.resolve(name)
        if spec.kind.is_llm:
            llm = self._llms.get(spec.id)
            if llm is None:
                raise ModelUnavailableError(f"{spec.id} is not ready yet", retry_after_s=2.0)
            yield RayLease(spec, llm, {})
            return
        predictor = self._predictor(spec)
        if spec.kind == ModelKind.TENSOR and spec.id not in self._metadata:
            self._metadata[spec.id] = await predictor.call("metadata")
        self._loaded.add(spec.id)
        yield RayLease(spec, predictor, self._metadata.get(spec.id, {}))

    async def load(self, name: str) -> None:
        spec = self.catalog.resolve(name)
        if not spec.kind.is_llm:
            await self._predictor(spec).call("load")
            self._loaded.add(spec.id)

    async def unload(self, name: str) -> None:
        spec = self.catalog.resolve(name)
        if not spec.kind.is_llm:
            await self._predictor(spec).call("unload")
            self._loaded.discard(spec.id)

    def spec(self, name: str) -> ModelSpec:
        return self.catalog.resolve(name)

    def state(self, name: str) -> str:
        spec = self.catalog.resolve(name)
        loaded = spec.id in self._llms or spec.id in self._loaded
        return "loaded" if loaded else "unloaded"

    def metadata(self, name: str) -> dict[str, Any] | None:
        return self._metadata.get(self.catalog.resolve(name).id)

    def describe(self) -> dict[str, Any]:
        available = [_describe_spec(spec, self.state(spec.id)) for spec in self.catalog]
        return {
            "models": available,
            "available_models": available,
            "loaded_models": [m for m in available if m["state"] == "loaded"],
            "ready": self.ready,
            "backend": "ray",
        }

    def _predictor(self, spec: ModelSpec) -> RayPredictor:
        if self._pool is None:
            raise ModelUnavailableError(f"{spec.id}: no model pool is deployed", 5.0)
        return RayPredictor(self._pool, spec.id)


def _describe_spec(spec: ModelSpec, state: str) -> dict[str, Any]:
    return {
        "id": spec.id,
        "name": spec.name,
        "aliases": list(spec.aliases),
        "kind": str(spec.kind),
        "backend": spec.backend,
        "version": spec.version,
        "description": spec.description,
        "pin": spec.pin,
        "state": state,
        "last_error": None,
    }
