"""Run LLM requests for the routes: route, lease (with fallback), generate, time out, abort.

Pipeline of one HTTP request (`open_generation`):

1. the caller's Principal (gateway) must be allowed the requested model (else 403);
2. `app.state.router.route(name, principal)` gives targets: primary first, then fallbacks;
3. for each target: lease it from the provider (a LoRA adapter's target leases its base model
   and runs with the adapter: api.lora), build the prompts with its tokenizer, submit one
   engine request per prompt and wait for each one's first output. ModelUnavailableError,
   EngineOverloadedError and EngineDeadError move on to the next target; nothing has been sent
   to the client yet, so the last error becomes the response status (429, 503...).
4. the route reads `Generation.outputs(i)` (each read bounded by the request deadline) and
   always ends with `Generation.aclose()`: unfinished engine requests are aborted (iterator
   closed + explicit abort), the lease is released, usage and metrics are recorded.

`cancel_on_disconnect` cancels the handler when the client goes away before the response starts;
after that, StreamingResponse's own disconnect listener cancels the stream.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.requests import Request

from modelyard.api.errors import APIError, ClientDisconnectedError
from modelyard.api.llm_metrics import RequestTracker
from modelyard.engine.messages import LoRARequest
from modelyard.engine.protocol import (
    EngineDeadError,
    EngineOverloadedError,
    LLMClient,
    PromptTooLongError,
    RequestOutput,
)
from modelyard.engine.sampling_params import SamplingParams
from modelyard.gateway.base import (
    ANONYMOUS,
    PRINCIPAL_SCOPE_KEY,
    USAGE_SCOPE_KEY,
    Principal,
    RequestUsage,
    RouteDecision,
)
from modelyard.manager.base import ModelUnavailableError

log = logging.getLogger(__name__)

Prompt = str | list[int]
PromptBuilder = Callable[[LLMClient], Awaitable[list[Prompt]]]

#: Errors that send the request to the next route target (nothing was sent to the client yet).
FALLBACK_ERRORS = (ModelUnavailableError, EngineOverloadedError, EngineDeadError)


@dataclass(slots=True)
class EngineStream:
    """One engine request (one prompt, n completions) of an HTTP request."""

    request_id: str  # engine request id (ours, unique; never the client's X-Request-ID)
    iterator: AsyncIterator[RequestOutput]  # LLMClient.generate(...)
    tracker: RequestTracker  # metrics and counts
    pending: RequestOutput | None = None  # the first output, read before committing the target
    finished: bool = False  # the last output (finished=True) was read


@dataclass(slots=True)
class Generation:
    """The engine requests of one HTTP request on the chosen model; close with aclose()."""

    request: Request
    model_id: str  # the model that serves it
    llm: LLMClient
    decision: RouteDecision
    streams: list[EngineStream]
    deadline: float  # loop.time() by which everything must be done
    _stack: AsyncExitStack = field(default_factory=AsyncExitStack)
    _closed: bool = False

    async def outputs(self, index: int) -> AsyncIterator[RequestOutput]:
        """The outputs of stream `index`, in order; TimeoutError past the deadline."""
        stream = self.streams[index]
        if stream.pending is not None:
            first, stream.pending = stream.pending, None
            stream.tracker.observe(first)
            stream.finished = first.finished
            yield first
        while not stream.finished:
            try:
                async with asyncio.timeout_at(self.deadline):
                    output = await anext(stream.iterator)
            except StopAsyncIteration:
                stream.finished = True
                return
            stream.tracker.observe(output)
            stream.finished = output.finished
            yield output

    async def all_outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(stream index, output) of every stream, interleaved as they arrive."""
        if len(self.streams) == 1:
            async for output in self.outputs(0):
                yield 0, output
            return
        queue: asyncio.Queue[tuple[int, RequestOutput | None, BaseException | None]]
        queue = asyncio.Queue()

        async def pump(index: int) -> None:
            try:
                async for output in self.outputs(index):
                    queue.put_nowait((index, output, None))
            except Exception as exc:
                queue.put_nowait((index, None, exc))
                return
            queue.put_nowait((index, None, None))

        tasks = [asyncio.create_task(pump(i)) for i in range(len(self.streams))]
        try:
            remaining = len(tasks)
            while remaining:
                index, item, error = await queue.get()
                if error is not None:
                    raise error
                if item is None:
                    remaining -= 1
                    continue
                yield index, item
        finally:
            for task in tasks:
                task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(*tasks, return_exceptions=True)

    def timings(self) -> dict[str, Any]:
        """The `modelyard` field: the first stream's timings (all share the batch)."""
        return self.streams[0].tracker.timings() if self.streams else {}

    async def aclose(self) -> None:
        """Abort what is unfinished, release the lease, fill usage, record metrics."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            await _close_streams(self.llm, self.streams)
            usage = usage_of(self.request)
            usage.model = self.model_id
            for stream in self.streams:
                usage.prompt_tokens += stream.tracker.prompt_tokens
                usage.completion_tokens += stream.tracker.completion_tokens
                stream.tracker.record(aborted=not stream.finished)
            await self._stack.aclose()


def principal_of(request: Request) -> Principal:
    principal = request.scope.get(PRINCIPAL_SCOPE_KEY, ANONYMOUS)
    return principal if isinstance(principal, Principal) else ANONYMOUS


def usage_of(request: Request) -> RequestUsage:
    """The RequestUsage in the scope (created when the gateway did not put one there)."""
    usage = request.scope.get(USAGE_SCOPE_KEY)
    if not isinstance(usage, RequestUsage):
        usage = RequestUsage()
        request.scope[USAGE_SCOPE_KEY] = usage
    return usage


async def open_generation(
    request: Request,
    requested: str,
    build_prompts: PromptBuilder,
    params: SamplingParams,
    *,
    priority: int = 0,
) -> Generation:
    """Route, lease and start the engine requests (steps 1-3 above). Raises APIError or the
    engine/manager error of the last target tried (mapped to a status by errors.py)."""
    state = request.app.state
    principal = principal_of(request)
    if not principal.may_use(requested):
        raise APIError(403, f"model {requested!r} is not allowed for this key", param="model")
    decision: RouteDecision = state.router.route(requested, principal)
    if not decision.targets:
        raise APIError(404, f"model {requested!r} not found", param="model")
    deadline = asyncio.get_running_loop().time() + state.config.server.request_timeout_s
    last_error: BaseException | None = None
    async with asyncio.timeout_at(deadline):
        for target in decision.targets:
            stack = AsyncExitStack()
            adapter = state.loras.get(target) if hasattr(state, "loras") else None
            lora = adapter.lora if adapter is not None else None
            try:
                lease = await stack.enter_async_context(
                    state.provider.lease(adapter.base if adapter is not None else target)
                )
                model_id = target if adapter is not None else lease.model_id
                llm = _llm_of(lease, requested)
                prompts = await build_prompts(llm)
                streams = await _start_streams(
                    llm, prompts, params, principal.priority + priority, model_id, principal, lora
                )
            except FALLBACK_ERRORS as exc:
                await stack.aclose()
                last_error = exc
                state.router.report_failure(target)
                log.info("target %s of %r failed (%s); trying the next", target, requested, exc)
                continue
            except BaseException:
                await stack.aclose()
                raise
            return Generation(request, model_id, llm, decision, streams, deadline, stack)
    if last_error is None:  # pragma: no cover - targets is not empty
        raise APIError(503, "no route target")
    raise last_error


def _llm_of(lease: Any, requested: str) -> LLMClient:
    try:
        llm: LLMClient = lease.llm
    except TypeError as exc:
        raise APIError(
            400, f"model {requested!r} is not a text-generation model", param="model"
        ) from exc
    return llm


async def _start_streams(
    llm: LLMClient,
    prompts: Sequence[Prompt],
    params: SamplingParams,
    priority: int,
    model_id: str,
    principal: Principal,
    lora: LoRARequest | None = None,
) -> list[EngineStream]:
    """Submit every prompt and read each one's first output (errors surface here)."""
    streams: list[EngineStream] = []
    for prompt in prompts:
        request_id = f"req-{uuid.uuid4().hex}"
        options = {"lora": lora} if lora is not None else {}
        iterator = aiter(llm.generate(prompt, params, request_id, priority=priority, **options))
        streams.append(
            EngineStream(request_id, iterator, RequestTracker(model_id, principal.tenant))
        )
    try:
        if len(streams) == 1:
            streams[0].pending = await _first(streams[0], llm)
        else:
            firsts = await asyncio.gather(*(_first(s, llm) for s in streams))
            for stream, first in zip(streams, firsts, strict=True):
                stream.pending = first
    except BaseException:
        with anyio.CancelScope(shield=True):
            await _close_streams(llm, streams)
        raise
    return streams


async def _first(stream: EngineStream, llm: LLMClient) -> RequestOutput:
    try:
        return await anext(stream.iterator)
    except PromptTooLongError as exc:
        raise PromptTooLongError(f"{exc} (max_model_len={llm.max_model_len})") from exc
    except StopAsyncIteration as exc:
        raise EngineDeadError("the engine ended the request without output") from exc


async def _close_streams(llm: LLMClient, streams: Sequence[EngineStream]) -> None:
    """Close unfinished iterators (which aborts them) and abort explicitly as well."""
    for stream in streams:
        if stream.finished:
            continue
        aclose = getattr(stream.iterator, "aclose", None)
        if aclose is not None:
            with suppress(Exception):
                await aclose()
        try:
            await llm.abort(stream.request_id)
        except Exception:  # the engine may be gone; nothing more to free then
            log.debug("abort of %s failed", stream.request_id, exc_info=True)


@asynccontextmanager
async def cancel_on_disconnect(request: Request) -> AsyncIterator[None]:
    """Cancel the current task if the client disconnects inside the block; raises
    ClientDisconnectedError then. Use only before a streaming response has started."""
    task = asyncio.current_task()
    gone = asyncio.Event()

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                gone.set()
                if task is not None:
                    task.cancel()
                return

    watcher = asyncio.create_task(watch())
    try:
        yield
    except asyncio.CancelledError:
        if gone.is_set() and task is not None and task.uncancel() == 0:
            raise ClientDisconnectedError("client disconnected") from None
        raise
    finally:
        watcher.cancel()
        with suppress(asyncio.CancelledError):
            await watcher
