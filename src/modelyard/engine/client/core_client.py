"""The API-process side of the engine worker: start it, send it requests, route its outputs.

`EngineCoreClient.start(config)` starts the engine worker (`worker_entry.worker_main`) in a fresh
interpreter with the worker's own environment (`worker_entry.WORKER_ENVIRONMENT`, passed to the
child only, and ninja's folder on its PATH: `worker_entry.worker_path`) and waits for
`EngineReady`. The process itself (reader, watchdog, stop ladder) is a
`transport.process.WorkerSupervisor`; this module adds what the messages mean:

- every `EngineOutputs` is split into its `EngineOutput`s, each handed to the sink of its
  request as the message is read (outputs of unknown ids are dropped: the request was aborted
  or its consumer left); the latest `SchedulerStats` is kept. A sink is an asyncio.Queue, or
  any object with `put_nowait` (AsyncLLM's processes the output right there: one pass per
  engine step on the reader task, engine/client/async_llm.py);
- the worker sends at least one message every 0.5 s (a heartbeat when idle): after
  `heartbeat_timeout_s` of silence, or when the process exits, every in-flight request's queue
  receives an `EngineDeadError` and `is_alive` turns False.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from modelyard.engine.client.errors import EngineDeadError
from modelyard.engine.config import EngineConfig
from modelyard.engine.messages import (
    COMMAND_CODEC,
    WORKER_MESSAGE_CODEC,
    AbortRequests,
    EngineCommand,
    EngineFailed,
    EngineOutput,
    EngineOutputs,
    EngineReady,
    EngineRequest,
    FinishReason,
    PinPrefix,
    SchedulerStats,
    Shutdown,
    UnpinPrefixes,
    WorkerMessage,
)
from modelyard.engine.worker_entry import WORKER_ENVIRONMENT, worker_main, worker_path
from modelyard.transport.base import AsyncConnection
from modelyard.transport.process import (
    InFlight,
    ProcessHandle,
    WorkerStartError,
    WorkerSupervisor,
)
from modelyard.transport.spawn import start_process
from modelyard.transport.zmq_ipc import AsyncZmqConnection, new_ipc_addresses

#: How often the watchdog looks at the worker (death is noticed within twice this, about).
WATCH_INTERVAL_S = 0.2

ClientConnection = AsyncConnection[EngineCommand, WorkerMessage]
#: What a request's queue carries: its outputs, or the error that ended it.
QueueItem = EngineOutput | EngineDeadError
OutputQueue = asyncio.Queue[QueueItem]


class OutputSink(Protocol):
    """Where a request's outputs go (an OutputQueue is one). `put_nowait` runs on the event
    loop, in the reader task, once per output as each step's message is read: it must not
    block or raise."""

    def put_nowait(self, item: QueueItem, /) -> None: ...


class RequestStream:
    """The outputs of one engine request, as an async iterator; ends after the output with a
    finish_reason, raises EngineDeadError if the worker dies first."""

    def __init__(self, request_id: str, queue: OutputQueue) -> None:
        self.request_id = request_id
        self.queue = queue  # shared with other requests when the caller passed one in
        self._done = False

    def __aiter__(self) -> AsyncIterator[EngineOutput]:
        return self

    async def __anext__(self) -> EngineOutput:
        if self._done:
            raise StopAsyncIteration
        item = await self.queue.get()
        if isinstance(item, EngineDeadError):
            self._done = True
            raise item
        self._done = item.finish_reason is not None
        return item


class EngineCoreClient:
    """Owns one engine worker process and the connection to it."""

    def __init__(
        self,
        conn: ClientConnection,
        process: ProcessHandle,
        *,
        heartbeat_timeout_s: float = 30.0,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        """Wrap an already started worker; call `wait_ready` next (or use `start`)."""
        self._queues: InFlight[str, OutputSink] = InFlight(_put_error)
        self.worker: WorkerSupervisor[EngineCommand, WorkerMessage] = WorkerSupervisor(
            conn,
            process,
            name="engine worker",
            on_message=self._on_message,
            in_flight=self._queues,
            dead_error=lambda reason: EngineDeadError(f"engine worker is dead: {reason}"),
            heartbeat_timeout_s=heartbeat_timeout_s,
            watch_interval_s=WATCH_INTERVAL_S,
        )
        self._on_close = on_close
        self._stats = SchedulerStats()
        self._ready: EngineReady | None = None
        self._closed = False

    @classmethod
    async def start(
        cls,
        config: EngineConfig,
        *,
        ready_timeout_s: float = 600.0,
        heartbeat_timeout_s: float = 30.0,
    ) -> EngineCoreClient:
        """Start the worker and wait until it is ready. Raises RuntimeError with the worker's
        error when it fails to start, exits, or does not get ready in time."""
        addresses = new_ipc_addresses("modelyard-engine")
        conn: AsyncZmqConnection[EngineCommand, WorkerMessage] = AsyncZmqConnection(
            addresses, COMMAND_CODEC, WORKER_MESSAGE_CODEC
        )
        try:
            process = await start_process(
                worker_main,
                (config, addresses),
                env=WORKER_ENVIRONMENT,
                path=worker_path(),
                name="engine",
            )
        except BaseException:
            conn.close()
            raise
        client = cls(conn, process, heartbeat_timeout_s=heartbeat_timeout_s)
        try:
            await client.wait_ready(ready_timeout_s)
        except BaseException:
            await client.shutdown(timeout_s=2.0)
            raise
        return client

    async def wait_ready(self, timeout_s: float) -> EngineReady:
        """Wait for EngineReady (RuntimeError when the worker fails to start)."""
        try:
            self._ready = await self.worker.wait_ready(timeout_s, EngineReady, EngineFailed)
        except WorkerStartError as exc:
            raise RuntimeError(str(exc)) from None
        return self._ready

    @property
    def ready(self) -> EngineReady:
        if self._ready is None:
            raise RuntimeError("engine worker is not ready")
        return self._ready

    @property
    def is_alive(self) -> bool:
        return self.worker.is_alive

    @property
    def dead_reason(self) -> str | None:
        """Why the worker is considered dead (None while alive)."""
        return self.worker.dead_reason

    @property
    def pid(self) -> int | None:
        return self.worker.pid

    def stats(self) -> SchedulerStats:
        """The latest scheduler snapshot from the worker (refreshed at least every 0.5 s)."""
        return self._stats

    def num_in_flight(self) -> int:
        return len(self._queues)

    async def add_request(
        self, request: EngineRequest | PinPrefix, queue: OutputQueue | None = None
    ) -> RequestStream:
        """Send the request (or a pin, whose prefill request answers like one); its outputs go
        to `queue` (a new one unless given: callers that fan out pass one shared queue).
        Raises EngineDeadError when the worker is gone and ValueError for a request id
        already in flight."""
        queue = queue if queue is not None else asyncio.Queue()
        await self.send_request(request, queue)
        return RequestStream(request.request_id, queue)

    async def send_request(self, request: EngineRequest | PinPrefix, sink: OutputSink) -> None:
        """Send the request; its outputs go to `sink`. Errors as add_request."""
        self._check_alive()
        if request.request_id in self._queues:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        self._queues.add(request.request_id, sink)
        try:
            await self.worker.send(request)
        except BaseException:
            self._queues.pop(request.request_id)
            raise

    async def send(self, command: EngineCommand) -> None:
        """A command that needs no answer (e.g. DropLoRAs)."""
        self._check_alive()
        await self.worker.send(command)

    async def abort(self, request_ids: list[str]) -> None:
        """Abort in the engine (it frees their KV blocks at the next step). Each request still
        in flight receives a final output with FinishReason.ABORT right away."""
        for rid in request_ids:
            queue = self._queues.pop(rid)
            if queue is not None:
                queue.put_nowait(
                    EngineOutput(request_id=rid, new_token_ids=[], finish_reason=FinishReason.ABORT)
                )
        if request_ids and self.is_alive:
            await self.worker.send(AbortRequests(request_ids=list(request_ids)))

    async def unpin_prefixes(self, prefix_ids: list[str]) -> None:
        """Release pinned prefixes in the engine (engine/core/prefixes.py)."""
        self._check_alive()
        await self.worker.send(UnpinPrefixes(prefix_ids=list(prefix_ids)))

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Ask the worker to exit, join it (terminate, then kill, if it does not), fail what is
        still in flight, close the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.worker.stop(Shutdown(), "engine shut down", timeout_s)
        if self._on_close is not None:
            self._on_close()

    def _check_alive(self) -> None:
        if self.worker.dead_reason is not None:
            raise EngineDeadError(f"engine worker is dead: {self.worker.dead_reason}")
        if self._closed or self._ready is None:
            raise EngineDeadError("engine is not running")

    def _on_message(self, message: WorkerMessage) -> None:
        if not isinstance(message, EngineOutputs):
            return
        self._stats = message.stats
        for output in message.outputs:
            queue = self._queues.get(output.request_id)
            if queue is None:
                continue
            queue.put_nowait(output)
            if output.finish_reason is not None:
                self._queues.pop(output.request_id)


def _put_error(queue: OutputSink, error: BaseException) -> None:
    queue.put_nowait(error if isinstance(error, EngineDeadError) else EngineDeadError(str(error)))
