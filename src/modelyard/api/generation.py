"""LLM requests for the generation routes: engine streams over the request path's lease.

Pipeline of one HTTP request (`open_generation`):

1. the request path (gateway/request_path.py) authorizes the requested name, routes it, admits
   the tenant's quotas (tpm: body bytes / chars_per_token + max_tokens x n x prompts) and leases
   targets in order; the request's `cache_salt` becomes the tenant's prefix-cache salt
   (gateway/pin_policy.py);
2. for the leased LLM, `start` builds the prompts with its tokenizer, checks the request's size
   (api/limits.py: n x prompts, x max_tokens), submits one engine request per prompt and waits
   for each one's first output; an overloaded or dead engine makes the path
   try the next target (nothing has been sent to the client yet);
3. the route reads `Generation.outputs(i)` (each read bounded by the request deadline) and
   always ends with `Generation.aclose()`: unfinished engine requests are aborted (iterator
   closed + explicit abort), token counts go to the path, which releases the lease and settles.

`cancel_on_disconnect` cancels the handler when the client goes away before the response starts;
after that, StreamingResponse's own disconnect listener cancels the stream.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from starlette.requests import Request

from modelyard.api.errors import ClientDisconnectedError
from modelyard.api.limits import check_generation_limits
from modelyard.engine.client.errors import MissingCapabilityError
from modelyard.engine.client.protocol import (
    EngineDeadError,
    LLMClient,
    PromptTooLongError,
    RequestOutput,
)
from modelyard.engine.sampling_params import SamplingParams
from modelyard.gateway.base import Principal, RouteDecision
from modelyard.gateway.pin_policy import PinPolicy
from modelyard.gateway.request_path import (
    Demand,
    RequestPath,
    Served,
    principal_of,
    ticket_of,
)
from modelyard.manager.base import Lease
from modelyard.observability.llm_metrics import RequestTracker

log = logging.getLogger(__name__)

Prompt = str | list[int]
PromptBuilder = Callable[[LLMClient], Awaitable[list[Prompt]]]
#: The params of a request for the model that serves it.
ParamsAdapter = Callable[[LLMClient, SamplingParams], SamplingParams]


@dataclass(slots=True)
class EngineStream:
    """One engine request (one prompt, n completions) of an HTTP request."""

    request_id: str  # engine request id (ours, unique; never the client's X-Request-ID)
    iterator: AsyncIterator[RequestOutput]  # LLMClient.generate(...)
    tracker: RequestTracker  # metrics and counts
    pending: RequestOutput | None = None  # the first output, read before committing the target
    finished: bool = False  # the last output (finished=True) was read


class ReadDeadline:
    """Bounds every read of a request's outputs by its deadline with one loop timer for the
    whole request, where `asyncio.timeout_at` around each read arms and cancels a timer per
    token. When the timer fires, the tasks waiting in `read` are cancelled and raise
    TimeoutError (as asyncio.timeout does: a cancellation from elsewhere stays one); a read
    that starts after it raises TimeoutError at once."""

    __slots__ = ("_expired", "_handle", "_readers", "_when")

    def __init__(self, when: float) -> None:
        self._when = when  # loop.time()
        self._handle: asyncio.TimerHandle | None = None
        self._expired = False
        self._readers: dict[asyncio.Task[Any], int] = {}  # reader -> its cancelling() count

    async def read(self, iterator: AsyncIterator[RequestOutput]) -> RequestOutput:
        """anext(iterator), or TimeoutError past the deadline."""
        loop = asyncio.get_running_loop()
        if self._expired or loop.time() >= self._when:
            self._expired = True
            raise TimeoutError
        if self._handle is None:
            self._handle = loop.call_at(self._when, self._expire)
        task = asyncio.current_task()
        assert task is not None  # reads run in tasks
        self._readers[task] = task.cancelling()
        try:
            return await anext(iterator)
        except asyncio.CancelledError:
            if self._expired and task.uncancel() <= self._readers[task]:
                raise TimeoutError from None
            raise
        finally:
            del self._readers[task]

    def _expire(self) -> None:
        self._expired = True
        for task in self._readers:
            task.cancel()

    def close(self) -> None:
        """Disarm the timer (the request is done)."""
        if self._handle is not None:
            self._handle.cancel()


@dataclass(slots=True)
class Generation:
    """The engine requests of one HTTP request on the served model; close with aclose()."""

    served: Served[list[EngineStream]]  # the request path's lease, quota and usage
    llm: LLMClient  # the serving engine
    _closed: bool = False
    _deadline: ReadDeadline | None = field(default=None, repr=False)  # made at the first read

    @property
    def model_id(self) -> str:
        """The model that serves it."""
        return self.served.model_id

    @property
    def decision(self) -> RouteDecision:
        return self.served.decision

    @property
    def streams(self) -> list[EngineStream]:
        return self.served.value

    @property
    def deadline(self) -> float:
        """loop.time() by which everything must be done."""
        return self.served.deadline

    async def outputs(self, index: int) -> AsyncIterator[RequestOutput]:
        """The outputs of stream `index`, in order; TimeoutError past the deadline."""
        stream = self.streams[index]
        if stream.pending is not None:
            first, stream.pending = stream.pending, None
            stream.tracker.observe(first)
            stream.finished = first.finished
            yield first
        if self._deadline is None:
            self._deadline = ReadDeadline(self.deadline)
        while not stream.finished:
            try:
                output = await self._deadline.read(stream.iterator)
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
        """Abort what is unfinished, record metrics, hand the token counts to the request path,
        which releases the lease and settles the quota."""
        if self._closed:
            return
        self._closed = True
        if self._deadline is not None:
            self._deadline.close()
        with anyio.CancelScope(shield=True):
            try:
                await _close_streams(self.llm, self.streams)
                for stream in self.streams:
                    self.served.record_tokens(
                        stream.tracker.prompt_tokens, stream.tracker.completion_tokens
                    )
                    stream.tracker.record(aborted=not stream.finished)
            finally:
                await self.served.aclose()


async def open_generation(
    request: Request,
    requested: str,
    build_prompts: PromptBuilder,
    params: SamplingParams,
    *,
    priority: int = 0,
    num_prompts: int = 1,
    adapt_params: ParamsAdapter | None = None,
) -> Generation:
    """Steps 1-2 above; raises the request path's refusals or the error of the last target.
    `adapt_params` gives the params for the model that serves (tools: the grammar of calls
    depends on the model's call format)."""
    path: RequestPath = request.app.state.request_path
    principal = principal_of(request)
    ticket = ticket_of(request)
    salt = PinPolicy.of(ticket).cache_salt(params.cache_salt)
    params = msgspec.structs.replace(params, cache_salt=salt)
    demand = Demand.generation(
        ticket.gateway.config.rate_limit,
        body_bytes=len(await request.body()),
        max_tokens=params.max_tokens,
        sequences=params.n * num_prompts,
    )

    async def start(lease: Lease) -> list[EngineStream]:
        prompts = await build_prompts(lease.llm)
        server = request.app.state.config.server
        used = adapt_params(lease.llm, params) if adapt_params is not None else params
        check_generation_limits(len(prompts), used, lease.llm.max_model_len, server)
        if used.constraint is not None and not lease.llm.capabilities.structured_output:
            raise MissingCapabilityError(lease.model_id, "structured output")
        return await _start_streams(
            lease.llm, prompts, used, principal.priority + priority, lease.model_id, principal
        )

    served = await path.open_llm(request, requested, demand, start)
    return Generation(served, served.lease.llm)


async def _start_streams(
    llm: LLMClient,
    prompts: Sequence[Prompt],
    params: SamplingParams,
    priority: int,
    model_id: str,
    principal: Principal,
) -> list[EngineStream]:
    """Submit every prompt and read each one's first output (errors surface here)."""
    streams: list[EngineStream] = []
    for prompt in prompts:
        request_id = f"req-{uuid.uuid4().hex}"
        iterator = aiter(llm.generate(prompt, params, request_id, priority=priority))
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
