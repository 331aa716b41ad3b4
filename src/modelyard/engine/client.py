"""The API-process side of the engine worker: start it, talk to it, notice when it dies.

`EngineCoreClient.start(config)` spawns `worker.run_engine_worker` (start method `spawn`), waits
for `EngineReady`, then runs two background tasks on the event loop:

- the receiver: every `EngineOutputs` from the worker is split into its `EngineOutput`s, each
  routed to the asyncio.Queue of its request (outputs of unknown ids are dropped: the request was
  aborted or its consumer left); the latest `SchedulerStats` is kept;
- the watchdog: every WATCH_INTERVAL_S it checks the process (exit code) and the time since the
  last message (the worker sends a heartbeat at least every 0.5 s). On death every in-flight
  request's queue receives an `EngineDeadError` and `is_alive` turns False.

Nothing blocks the event loop: process start and join run in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from modelyard.engine.config import EngineConfig
from modelyard.engine.messages import (
    AbortRequests,
    EngineCommand,
    EngineFailed,
    EngineOutput,
    EngineOutputs,
    EngineReady,
    EngineRequest,
    FinishReason,
    SchedulerStats,
    Shutdown,
    WorkerMessage,
)
from modelyard.engine.protocol import EngineDeadError
from modelyard.engine.worker import COMMAND_CODEC, WORKER_MESSAGE_CODEC, run_engine_worker
from modelyard.transport.base import AsyncConnection
from modelyard.transport.zmq_ipc import AsyncZmqConnection, new_ipc_addresses

logger = logging.getLogger(__name__)

#: How often the watchdog looks at the worker (death is noticed within this plus a little).
WATCH_INTERVAL_S = 0.2

ClientConnection = AsyncConnection[EngineCommand, WorkerMessage]
#: What a request's queue carries: its outputs, or the error that ended it.
QueueItem = EngineOutput | EngineDeadError
OutputQueue = asyncio.Queue[QueueItem]


# Environment of the engine worker process (a value the user set wins):
# - OMP_WAIT_POLICY=PASSIVE: OpenMP threads sleep at barriers instead of spinning. The API
#   process, the engine and other workers share a few cores, and spinning threads starve them
#   (a contended 32-decode step took 3.3 s spinning, 0.59 s passive).
# - GLIBC_TUNABLES: freed tensors stay in malloc's heap instead of going back to the kernel, so
#   the next step's same-sized tensors do not page-fault afresh (prefill steps ~15 % faster,
#   decode steps ~4 %); the worker's RSS stays at its peak, as with tcmalloc. `hugetlb=1` asks
#   for transparent huge pages on that heap (madvise; a no-op where THP is off): the KV cache is
#   read in 4 KiB blocks scattered over a GiB, and with 2 MiB pages decode attention stops
#   missing the TLB on every block (~18 % faster attention).
WORKER_ENVIRONMENT = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "GLIBC_TUNABLES": (
        "glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=4294967296"
        ":glibc.malloc.trim_threshold=17179869184"
    ),
}


class WorkerHandle(Protocol):
    """The part of multiprocessing.Process the client uses (tests pass a thread-backed fake)."""

    @property
    def exitcode(self) -> int | None: ...

    def is_alive(self) -> bool: ...

    def join(self, timeout: float | None = None) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


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
        process: WorkerHandle,
        *,
        heartbeat_timeout_s: float = 30.0,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        """Wrap an already started worker; call `wait_ready` next (or use `start`)."""
        self._conn = conn
        self._process = process
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._on_close = on_close
        self._queues: dict[str, OutputQueue] = {}
        self._stats = SchedulerStats()
        self._ready: EngineReady | None = None
        self._dead_reason: str | None = None
        self._closed = False
        self._last_message = time.monotonic()
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def start(
        cls,
        config: EngineConfig,
        *,
        ready_timeout_s: float = 600.0,
        heartbeat_timeout_s: float = 30.0,
    ) -> EngineCoreClient:
        """Spawn the worker and wait until it is ready. Raises RuntimeError with the worker's
        error when it fails to start, exits, or does not get ready in time."""
        addresses = new_ipc_addresses("modelyard-engine")
        conn: AsyncZmqConnection[EngineCommand, WorkerMessage] = AsyncZmqConnection(
            addresses, COMMAND_CODEC, WORKER_MESSAGE_CODEC
        )
        for name, value in WORKER_ENVIRONMENT.items():  # read by the spawned child at start
            os.environ.setdefault(name, value)  # a value the user set wins
        ctx = multiprocessing.get_context("spawn")
        process = ctx.Process(
            target=run_engine_worker, args=(config, addresses), name="modelyard-engine", daemon=True
        )
        await asyncio.to_thread(process.start)
        client = cls(conn, process, heartbeat_timeout_s=heartbeat_timeout_s)
        try:
            await client.wait_ready(ready_timeout_s)
        except BaseException:
            await client.shutdown(timeout_s=2.0)
            raise
        return client

    async def wait_ready(self, timeout_s: float) -> EngineReady:
        """Wait for EngineReady, then start the receiver and the watchdog."""
        deadline = time.monotonic() + timeout_s
        while self._ready is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"engine worker not ready after {timeout_s:.0f} s")
            if not self._process.is_alive():
                raise RuntimeError(f"engine worker exited with code {self._process.exitcode}")
            try:
                message = await asyncio.wait_for(
                    self._conn.recv(), min(remaining, WATCH_INTERVAL_S)
                )
            except TimeoutError:
                continue
            if isinstance(message, EngineFailed):
                raise RuntimeError(f"engine worker failed to start: {message.error}")
            if isinstance(message, EngineReady):
                self._ready = message
        self._last_message = time.monotonic()
        self._tasks = [
            asyncio.create_task(self._receive_loop(), name="engine-client-recv"),
            asyncio.create_task(self._watch_loop(), name="engine-client-watch"),
        ]
        return self._ready

    @property
    def ready(self) -> EngineReady:
        if self._ready is None:
            raise RuntimeError("engine worker is not ready")
        return self._ready

    @property
    def is_alive(self) -> bool:
        return self._ready is not None and self._dead_reason is None and not self._closed

    @property
    def dead_reason(self) -> str | None:
        """Why the worker is considered dead (None while alive)."""
        return self._dead_reason

    @property
    def pid(self) -> int | None:
        return getattr(self._process, "pid", None)

    def stats(self) -> SchedulerStats:
        """The latest scheduler snapshot from the worker (refreshed at least every 0.5 s)."""
        return self._stats

    def num_in_flight(self) -> int:
        return len(self._queues)

    async def add_request(
        self, request: EngineRequest, queue: OutputQueue | None = None
    ) -> RequestStream:
        """Send the request; its outputs go to `queue` (a new one unless given: callers that
        fan out pass one shared queue). Raises EngineDeadError when the worker is gone and
        ValueError for a request id already in flight."""
        self._check_alive()
        if request.request_id in self._queues:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        queue = queue if queue is not None else asyncio.Queue()
        self._queues[request.request_id] = queue
        try:
            await self._conn.send(request)
        except BaseException:
            self._queues.pop(request.request_id, None)
            raise
        return RequestStream(request.request_id, queue)

    async def send(self, command: EngineCommand) -> None:
        """A command that needs no answer (e.g. DropLoRAs)."""
        self._check_alive()
        await self._conn.send(command)

    async def abort(self, request_ids: list[str]) -> None:
        """Abort in the engine (it frees their KV blocks at the next step). Each request still
        in flight receives a final output with FinishReason.ABORT right away."""
        queues = [(rid, self._queues.pop(rid)) for rid in request_ids if rid in self._queues]
        for rid, queue in queues:
            queue.put_nowait(
                EngineOutput(request_id=rid, new_token_ids=[], finish_reason=FinishReason.ABORT)
            )
        if request_ids and self.is_alive:
            await self._conn.send(AbortRequests(request_ids=list(request_ids)))

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Ask the worker to exit, join it (terminate, then kill, if it does not), fail what is
        still in flight, close the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        if self._process.is_alive():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._conn.send(Shutdown()), 1.0)
            await asyncio.to_thread(self._process.join, timeout_s)
        for stop in (self._process.terminate, self._process.kill):
            if not self._process.is_alive():
                break
            logger.warning("engine worker did not exit; %s", stop.__name__)
            stop()
            await asyncio.to_thread(self._process.join, 2.0)
        self._fail_all(self._dead_reason or "engine shut down")
        self._conn.close()
        if self._on_close is not None:
            self._on_close()

    def _check_alive(self) -> None:
        if self._dead_reason is not None:
            raise EngineDeadError(f"engine worker is dead: {self._dead_reason}")
        if self._closed or self._ready is None:
            raise EngineDeadError("engine is not running")

    async def _receive_loop(self) -> None:
        while True:
            message = await self._conn.recv()
            self._last_message = time.monotonic()
            if not isinstance(message, EngineOutputs):
                continue
            self._stats = message.stats
            for output in message.outputs:
                queue = self._queues.get(output.request_id)
                if queue is None:
                    continue
                queue.put_nowait(output)
                if output.finish_reason is not None:
                    del self._queues[output.request_id]

    async def _watch_loop(self) -> None:
        while self._dead_reason is None:
            await asyncio.sleep(WATCH_INTERVAL_S)
            if not self._process.is_alive():
                self._mark_dead(f"worker process exited with code {self._process.exitcode}")
            elif time.monotonic() - self._last_message > self._heartbeat_timeout_s:
                self._mark_dead(f"no message from the worker for {self._heartbeat_timeout_s} s")

    def _mark_dead(self, reason: str) -> None:
        logger.error("engine worker dead: %s (%d requests in flight)", reason, len(self._queues))
        self._dead_reason = reason
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        self._fail_all(reason)

    def _fail_all(self, reason: str) -> None:
        for queue in self._queues.values():
            queue.put_nowait(EngineDeadError(f"engine worker is dead: {reason}"))
        self._queues.clear()
