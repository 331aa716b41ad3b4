"""One supervisor for every worker process: wait until ready, read, watch, stop, fail in-flight.

`WorkerSupervisor[C, M]` owns a started child process and the connection to it (commands `C`
out, messages `M` in). Its users (the engine client, a model's worker client) add what their
messages mean; the process's life is handled here, once:

1. `wait_ready(timeout_s, ready, failed)`: read messages until one of type `ready` (returned) or
   `failed` (its `error`); the child's exit and the timeout end the wait too. Every way out but
   the ready message raises `WorkerStartError`.
2. Then two tasks run on the event loop: the reader hands every message to `on_message`; the
   watchdog looks every `watch_interval_s` at the process and, with `heartbeat_timeout_s`, at
   the time since the last message. On a death it waits one more interval (so the reader takes
   what the child sent before dying), then fails every in-flight call.
3. `stop(stop_message, reason)`: send `stop_message`, join; then terminate, then kill, each with
   a join; cancel the tasks, fail what is still in flight, close the connection. Idempotent.

In-flight calls live in `in_flight` (an `InFlight`: key -> the sink their answer goes to, a
queue or a future); failing them puts `dead_error(reason)` into every sink. Nothing here blocks
the loop: joins run in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from modelyard.transport.base import AsyncConnection

logger = logging.getLogger(__name__)

C = TypeVar("C")
M = TypeVar("M")
K = TypeVar("K")
S = TypeVar("S")
R = TypeVar("R")


class ProcessHandle(Protocol):
    """The part of a process the supervisor uses (multiprocessing.Process has it; tests pass
    thread-backed fakes)."""

    @property
    def exitcode(self) -> int | None: ...

    def is_alive(self) -> bool: ...

    def join(self, timeout: float | None = None) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


class StartFailure(Protocol):
    """The message a child sends instead of its ready message."""

    @property
    def error(self) -> str: ...


class WorkerStartError(RuntimeError):
    """The worker did not get ready: it reported a failure, exited, or timed out."""


class InFlight(Generic[K, S]):
    """Calls sent to a worker and not answered yet: key -> the sink the answer goes to."""

    def __init__(self, fail: Callable[[S, BaseException], None]) -> None:
        self._fail = fail  # puts an error into one sink
        self._sinks: dict[K, S] = {}

    def add(self, key: K, sink: S) -> None:
        self._sinks[key] = sink

    def get(self, key: K) -> S | None:
        return self._sinks.get(key)

    def pop(self, key: K) -> S | None:
        return self._sinks.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._sinks

    def __len__(self) -> int:
        return len(self._sinks)

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._sinks))

    def fail_all(self, error: BaseException) -> None:
        sinks, self._sinks = list(self._sinks.values()), {}
        for sink in sinks:
            self._fail(sink, error)


class WorkerSupervisor(Generic[C, M]):
    """A started child process and its connection (see the module docstring)."""

    def __init__(
        self,
        conn: AsyncConnection[C, M],
        process: ProcessHandle,
        *,
        name: str,  # "engine worker", "worker of model 'x'": starts every error message
        on_message: Callable[[M], None],
        in_flight: InFlight[Any, Any],
        dead_error: Callable[[str], BaseException],  # the error in-flight calls get
        heartbeat_timeout_s: float | None = None,  # None: silence is fine (no heartbeats)
        watch_interval_s: float = 0.2,
    ) -> None:
        self.conn = conn
        self.process = process
        self.name = name
        self.in_flight = in_flight
        self._on_message = on_message
        self._dead_error = dead_error
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._watch_interval_s = watch_interval_s
        self._ready = False
        self._stopped = False
        self._dead_reason: str | None = None
        self._last_message = time.monotonic()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def is_alive(self) -> bool:
        """Ready, not stopped, and not found dead (process and heartbeat)."""
        alive = self._ready and not self._stopped and self._dead_reason is None
        return alive and self.process.is_alive()

    @property
    def dead_reason(self) -> str | None:
        """Why the worker is considered dead (None while alive)."""
        return self._dead_reason

    @property
    def pid(self) -> int | None:
        pid: int | None = getattr(self.process, "pid", None)
        return pid

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    async def wait_ready(self, timeout_s: float, ready: type[R], failed: type[StartFailure]) -> R:
        """The ready message; then the reader and the watchdog start. WorkerStartError else."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerStartError(f"{self.name} not ready after {timeout_s:.0f} s")
            if not self.process.is_alive():
                raise WorkerStartError(f"{self.name} exited with code {self.exitcode}")
            try:
                message = await asyncio.wait_for(
                    self.conn.recv(), min(remaining, self._watch_interval_s)
                )
            except TimeoutError:
                continue
            if isinstance(message, failed):
                raise WorkerStartError(f"{self.name} failed to start: {message.error}")
            if isinstance(message, ready):
                break
        self._ready = True
        self._last_message = time.monotonic()
        self._tasks = [
            asyncio.create_task(self._read(), name=f"{self.name} reader"),
            asyncio.create_task(self._watch(), name=f"{self.name} watchdog"),
        ]
        return message

    async def send(self, command: C) -> None:
        await self.conn.send(command)

    async def stop(self, stop_message: C, reason: str, timeout_s: float = 5.0) -> None:
        """Ask the worker to exit, then terminate and kill it if it does not; fail what is in
        flight with `reason` (or the death's), close the connection. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self.process.is_alive():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.conn.send(stop_message), 1.0)
            await asyncio.to_thread(self.process.join, timeout_s)
        for escalate in (self.process.terminate, self.process.kill):
            if not self.process.is_alive():
                break
            logger.warning("%s did not exit; %s", self.name, escalate.__name__)
            escalate()
            await asyncio.to_thread(self.process.join, 2.0)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.in_flight.fail_all(self._dead_error(self._dead_reason or reason))
        self.conn.close()

    async def _read(self) -> None:
        while True:
            message = await self.conn.recv()
            self._last_message = time.monotonic()
            self._on_message(message)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._watch_interval_s)
            if self._stopped:
                return
            if not self.process.is_alive():
                await asyncio.sleep(self._watch_interval_s)  # the reader takes what was sent
                reason = f"worker process exited with code {self.exitcode}"
            elif self._silent_for() > (self._heartbeat_timeout_s or float("inf")):
                reason = f"no message from the worker for {self._heartbeat_timeout_s} s"
            else:
                continue
            if not self._stopped:
                self._die(reason)
            return

    def _silent_for(self) -> float:
        return time.monotonic() - self._last_message

    def _die(self, reason: str) -> None:
        logger.error("%s dead: %s (%d calls in flight)", self.name, reason, len(self.in_flight))
        self._dead_reason = reason
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        self.in_flight.fail_all(self._dead_error(reason))
