"""A non-LLM model's worker process, seen from the API process (implements `Predictor`).

`await WorkerProcess.start(spec)` spawns the process (forkserver by default: each worker forks
from a small, clean server process, so starting one costs milliseconds, not an interpreter
start), waits for WorkerReady or WorkerFailed, and starts two tasks: a reader that resolves
each request's future from the worker's replies, and a watchdog that notices a dead process and
fails every in-flight request with `ModelUnavailableError` (a clear 503). `stop()` asks the
worker to exit (it closes its backend explicitly), then terminates/kills it if it does not:
the memory goes back to the OS with the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import time
from multiprocessing.context import BaseContext
from typing import Any

import psutil

from modelyard.backends import backend_target
from modelyard.manager.base import ModelLoadError, ModelUnavailableError
from modelyard.model_spec import ModelKind, ModelSpec
from modelyard.observability import metrics
from modelyard.transport.base import Codec
from modelyard.transport.zmq_ipc import AsyncZmqConnection, new_ipc_addresses
from modelyard.workers.main import worker_main
from modelyard.workers.messages import (
    FromWorker,
    PredictError,
    PredictRequest,
    PredictResult,
    StopWorker,
    ToWorker,
    WorkerFailed,
    WorkerReady,
)

_WATCH_INTERVAL_S = 0.1
_contexts: dict[str, BaseContext] = {}


def worker_context(start_method: str = "forkserver", preload: tuple[str, ...] = ()) -> BaseContext:
    """The multiprocessing context for workers. forkserver preloads the worker module and
    `preload` (e.g. "torch": each worker then forks with torch imported, saving seconds per
    load); the first call in a process fixes the preload list."""
    if start_method not in _contexts:
        ctx = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            ctx.set_forkserver_preload(["modelyard.workers.main", *preload])
        _contexts[start_method] = ctx
    return _contexts[start_method]


class WorkerProcess:
    """One worker process serving one model; `predict` may be called concurrently."""

    def __init__(self, spec: ModelSpec, process: Any, conn: Any) -> None:
        self.spec = spec
        self.process = process
        self._conn = conn
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[PredictResult]] = {}
        self._ready: asyncio.Future[WorkerReady] = asyncio.get_running_loop().create_future()
        self._death: str | None = None
        self.metadata: dict[str, Any] = {}
        self._tasks = [
            asyncio.create_task(self._read(), name=f"worker-reader-{spec.id}"),
            asyncio.create_task(self._watch(), name=f"worker-watchdog-{spec.id}"),
        ]

    @classmethod
    async def start(
        cls,
        spec: ModelSpec,
        *,
        start_method: str = "forkserver",
        preload: tuple[str, ...] = (),
        ready_timeout_s: float = 300.0,
    ) -> WorkerProcess:
        """Spawn and wait until the backend loaded; ModelLoadError when it cannot."""
        if spec.kind.is_llm:
            raise ValueError(f"{spec.id}: LLM kinds run in the engine, not a batcher worker")
        target = backend_target(spec)
        addresses = new_ipc_addresses(prefix=f"modelyard-{spec.id}")
        conn: AsyncZmqConnection[ToWorker, FromWorker] = AsyncZmqConnection(
            addresses, Codec(ToWorker), Codec(FromWorker)
        )
        ctx = worker_context(start_method, preload)
        process = ctx.Process(  # type: ignore[attr-defined]
            target=worker_main,
            args=(spec, addresses, target),
            name=f"modelyard-{spec.id}",
            daemon=True,
        )
        try:
            await asyncio.to_thread(process.start)
        except Exception:
            conn.close()
            raise
        worker = cls(spec, process, conn)
        try:
            ready = await asyncio.wait_for(asyncio.shield(worker._ready), ready_timeout_s)
        except BaseException as exc:  # failed, timed out or cancelled: never leave a process
            await asyncio.shield(worker.stop(timeout_s=2.0))
            if isinstance(exc, TimeoutError):
                raise ModelLoadError(f"{spec.id}: not ready after {ready_timeout_s} s") from exc
            raise
        worker.metadata = ready.metadata
        return worker

    @property
    def pid(self) -> int | None:
        pid: int | None = self.process.pid
        return pid

    @property
    def kind(self) -> ModelKind:
        return self.spec.kind

    @property
    def is_alive(self) -> bool:
        return self._death is None and bool(self.process.is_alive())

    def memory_bytes(self) -> int | None:
        """The worker's resident memory now (None if it is gone)."""
        try:
            return int(psutil.Process(self.process.pid).memory_info().rss)
        except (psutil.Error, TypeError, ValueError):
            return None

    async def predict(self, inputs: Any, options: dict[str, Any] | None = None) -> Any:
        """Send a list of items, wait for one output per item. ValueError for bad input,
        ModelUnavailableError when the worker died."""
        if self._death is not None:
            raise ModelUnavailableError(self._death)
        request_id = next(self._ids)
        future: asyncio.Future[PredictResult] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        start = time.perf_counter()
        model = self.spec.id
        try:
            await self._conn.send(
                PredictRequest(request_id=request_id, inputs=list(inputs), options=options or {})
            )
            result = await future
        except ValueError:
            metrics.INFERENCE_REQUESTS.labels(model, "bad_input").inc()
            raise
        except BaseException:
            metrics.INFERENCE_REQUESTS.labels(model, "error").inc()
            raise
        finally:
            self._pending.pop(request_id, None)
        metrics.INFERENCE_REQUESTS.labels(model, "success").inc()
        metrics.INFERENCE_REQUEST_DURATION.labels(model).observe(time.perf_counter() - start)
        metrics.INFERENCE_QUEUE_DURATION.labels(model).observe(result.queue_s)
        metrics.INFERENCE_COMPUTE_DURATION.labels(model).observe(result.compute_s)
        metrics.INFERENCE_BATCH_SIZE.labels(model).observe(result.batch_size)
        return result.outputs

    async def _read(self) -> None:
        while True:
            message = await self._conn.recv()
            if isinstance(message, WorkerReady):
                if not self._ready.done():
                    self._ready.set_result(message)
            elif isinstance(message, WorkerFailed):
                self._fail_ready(ModelLoadError(f"{self.spec.id}: {message.error}"))
            elif isinstance(message, PredictResult | PredictError):
                self._resolve(message)

    def _resolve(self, message: PredictResult | PredictError) -> None:
        future = self._pending.get(message.request_id)
        if future is None or future.done():
            return
        if isinstance(message, PredictResult):
            future.set_result(message)
        elif message.bad_input:
            future.set_exception(ValueError(message.error))
        else:
            future.set_exception(RuntimeError(f"{self.spec.id}: {message.error}"))

    def _fail_ready(self, error: Exception) -> None:
        if not self._ready.done():
            self._ready.set_exception(error)
            self._ready.exception()  # retrieved: no "never retrieved" warning if nobody waits

    async def _watch(self) -> None:
        while self.process.is_alive():  # noqa: ASYNC110 (a process exit is not an Event)
            await asyncio.sleep(_WATCH_INTERVAL_S)
        await asyncio.sleep(_WATCH_INTERVAL_S)  # let the reader take replies already sent
        self._death = (
            f"the worker of model {self.spec.id!r} exited (code {self.process.exitcode}); "
            "it is reloaded on the next request"
        )
        self._fail_ready(ModelLoadError(f"{self.spec.id}: worker exited during load"))
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ModelUnavailableError(self._death))

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the worker to exit, then terminate or kill it; idempotent."""
        if self.process.is_alive():
            with contextlib.suppress(TimeoutError, OSError):
                await asyncio.wait_for(self._conn.send(StopWorker()), 1.0)
            await asyncio.to_thread(self.process.join, timeout_s)
        if self.process.is_alive():
            self.process.terminate()
            await asyncio.to_thread(self.process.join, 2.0)
        if self.process.is_alive():
            self.process.kill()
            await asyncio.to_thread(self.process.join, 2.0)
        if self._death is None:
            self._death = f"model {self.spec.id!r} was unloaded"
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ModelUnavailableError(self._death))
        self._conn.close()
