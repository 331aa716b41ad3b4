"""A non-LLM model's worker process, seen from the API process (implements `Predictor`).

`await WorkerProcess.start(spec)` starts `workers.main.worker_main` (forkserver by default: each
worker forks from a small, clean server process, so starting one costs milliseconds, not an
interpreter start) and waits for WorkerReady or WorkerFailed. The process itself (reader,
watchdog, stop ladder) is a `transport.process.WorkerSupervisor`; this module adds what the
messages mean: each reply resolves its request's future, and a dead worker fails every
in-flight request with `ModelUnavailableError` (a clear 503). `stop()` asks the worker to exit
(it closes its backend explicitly), then terminates/kills it: the memory goes back to the OS
with the process.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import time
from multiprocessing.context import BaseContext
from typing import Any

import psutil

from modelyard.backends import backend_target
from modelyard.manager.base import ModelLoadError, ModelUnavailableError, RequestFailedError
from modelyard.model_spec import ModelKind, ModelSpec
from modelyard.observability import metrics
from modelyard.transport.base import Codec
from modelyard.transport.process import (
    InFlight,
    ProcessHandle,
    WorkerStartError,
    WorkerSupervisor,
)
from modelyard.transport.zmq_ipc import AsyncZmqConnection, new_ipc_addresses
from modelyard.workers import messages as wire
from modelyard.workers.main import worker_main

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

    def __init__(self, spec: ModelSpec, process: ProcessHandle, conn: Any) -> None:
        self.spec = spec
        self.metadata: dict[str, Any] = {}
        self._ids = itertools.count()
        self._pending: InFlight[int, asyncio.Future[wire.PredictResult]] = InFlight(_set_error)
        self.worker: WorkerSupervisor[wire.ToWorker, wire.FromWorker] = WorkerSupervisor(
            conn,
            process,
            name=f"{spec.id} worker",
            on_message=self._on_message,
            in_flight=self._pending,
            dead_error=self._dead_error,
            watch_interval_s=_WATCH_INTERVAL_S,
        )

    @classmethod
    async def start(
        cls,
        spec: ModelSpec,
        *,
        start_method: str = "forkserver",
        preload: tuple[str, ...] = (),
        ready_timeout_s: float = 300.0,
    ) -> WorkerProcess:
        """Start and wait until the backend loaded; ModelLoadError when it cannot."""
        if spec.kind.is_llm:
            raise ValueError(f"{spec.id}: LLM kinds run in the engine, not a batcher worker")
        target = backend_target(spec)
        addresses = new_ipc_addresses(prefix=f"modelyard-{spec.id}")
        conn: AsyncZmqConnection[wire.ToWorker, wire.FromWorker] = AsyncZmqConnection(
            addresses, Codec(wire.ToWorker), Codec(wire.FromWorker)
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
            ready = await worker.worker.wait_ready(
                ready_timeout_s, wire.WorkerReady, wire.WorkerFailed
            )
        except BaseException as exc:  # failed, timed out or cancelled: never leave a process
            await asyncio.shield(worker.stop(timeout_s=2.0))
            if isinstance(exc, WorkerStartError):
                raise ModelLoadError(str(exc)) from None
            raise
        worker.metadata = ready.metadata
        return worker

    @property
    def holds_pins(self) -> bool:
        return False  # no KV cache: only LLM engines pin prefixes

    @property
    def pid(self) -> int | None:
        return self.worker.pid

    @property
    def kind(self) -> ModelKind:
        return self.spec.kind

    @property
    def is_alive(self) -> bool:
        return self.worker.is_alive

    def memory_bytes(self) -> int | None:
        """The worker's resident memory now (None if it is gone)."""
        try:
            return int(psutil.Process(self.pid).memory_info().rss)
        except (psutil.Error, TypeError, ValueError):
            return None

    async def predict(self, inputs: Any, options: dict[str, Any] | None = None) -> Any:
        """Send a list of items, wait for one output per item. ValueError for bad input,
        ModelUnavailableError when the worker died."""
        if not self.worker.is_alive:
            raise self._dead_error(self.worker.dead_reason or "not running")
        request_id = next(self._ids)
        future: asyncio.Future[wire.PredictResult] = asyncio.get_running_loop().create_future()
        self._pending.add(request_id, future)
        start = time.perf_counter()
        model = self.spec.id
        try:
            request = wire.PredictRequest(
                request_id=request_id, inputs=list(inputs), options=options or {}
            )
            await self.worker.send(request)
            result = await future
        except ValueError:
            metrics.INFERENCE_REQUESTS.labels(model, "bad_input").inc()
            raise
        except BaseException:
            metrics.INFERENCE_REQUESTS.labels(model, "error").inc()
            raise
        finally:
            self._pending.pop(request_id)
        metrics.INFERENCE_REQUESTS.labels(model, "success").inc()
        metrics.INFERENCE_REQUEST_DURATION.labels(model).observe(time.perf_counter() - start)
        metrics.INFERENCE_QUEUE_DURATION.labels(model).observe(result.queue_s)
        metrics.INFERENCE_COMPUTE_DURATION.labels(model).observe(result.compute_s)
        metrics.INFERENCE_BATCH_SIZE.labels(model).observe(result.batch_size)
        return result.outputs

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the worker to exit, then terminate or kill it; idempotent."""
        await self.worker.stop(wire.StopWorker(), "was unloaded", timeout_s)

    def _on_message(self, message: wire.FromWorker) -> None:
        if not isinstance(message, wire.PredictResult | wire.PredictError):
            return
        future = self._pending.get(message.request_id)
        if future is None or future.done():
            return
        if isinstance(message, wire.PredictResult):
            future.set_result(message)
        elif message.bad_input:
            future.set_exception(ValueError(message.error))
        else:
            future.set_exception(RequestFailedError(f"{self.spec.id}: {message.error}"))

    def _dead_error(self, reason: str) -> ModelUnavailableError:
        return ModelUnavailableError(
            f"the worker of model {self.spec.id!r} is gone ({reason}); "
            "it is reloaded on the next request"
        )


def _set_error(future: asyncio.Future[wire.PredictResult], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
