"""The body of a non-LLM worker process: load the backend, then serve batches until stopped.

Loop: receive requests (waiting at most until the next batch is due), preprocess each request's
items on arrival (a bad item fails only its request), run due batches through
`backend.infer`, send one reply per request with its timings. A batch whose backend call raises
runs again in halves (bisection), so only the requests that make it fail get the error and
their batch-mates get their outputs. Exits on StopWorker (closing the backend explicitly) or
when the parent process is gone.
"""

from __future__ import annotations

import os
import time
from typing import Any

import msgspec
import psutil

from modelyard.model_spec import ModelSpec
from modelyard.transport.base import Codec
from modelyard.transport.signals import ignore_group_signals
from modelyard.transport.zmq_ipc import IpcAddresses, SyncZmqConnection
from modelyard.workers.batcher import Batch, Batcher, PendingRequest
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

_IDLE_POLL_S = 0.5  # how often an idle worker checks that its parent lives
_OPTIONS_ENCODER = msgspec.json.Encoder(order="sorted")


def worker_main(spec: ModelSpec, addresses: IpcAddresses, backend: str) -> None:
    """Process entry point (must stay importable at module level for spawn/forkserver);
    `backend` is the "module:factory" the API process resolved (backends.backend_target)."""
    from modelyard.backends import create_backend

    ignore_group_signals()
    conn: SyncZmqConnection[FromWorker, ToWorker] = SyncZmqConnection(
        addresses, Codec(FromWorker), Codec(ToWorker)
    )
    try:
        model = create_backend(spec, backend)
        model.load()
        rss = psutil.Process().memory_info().rss
        conn.send(WorkerReady(pid=os.getpid(), rss_bytes=rss, metadata=model.metadata()))
    except Exception as exc:
        conn.send(WorkerFailed(error=f"{type(exc).__name__}: {exc}"))
        time.sleep(0.1)  # let the message leave before the socket closes
        conn.close()
        return
    try:
        _serve(conn, model, spec)
    finally:
        model.close()
        conn.close()


def _serve(conn: SyncZmqConnection[FromWorker, ToWorker], backend: Any, spec: ModelSpec) -> None:
    batcher = Batcher(spec.batching)
    parent = os.getppid()
    while True:
        due = batcher.time_until_ready(time.monotonic())
        message = conn.recv(_IDLE_POLL_S if due is None else due)
        while message is not None:
            if isinstance(message, StopWorker):
                return
            _accept(conn, backend, batcher, message)
            message = conn.recv(0)
        if due is None and os.getppid() != parent:
            return  # orphaned: the API process died
        while (batch := batcher.pop_batch(time.monotonic())) is not None:
            _run_batch(conn, backend, batch)


def _accept(conn: Any, backend: Any, batcher: Batcher, message: PredictRequest) -> None:
    try:
        prepared = [backend.preprocess(item, message.options) for item in message.inputs]
    except ValueError as exc:
        conn.send(PredictError(request_id=message.request_id, error=str(exc), bad_input=True))
        return
    except Exception as exc:  # unforeseen, but preparing one request's items: its input's fault
        error = f"invalid input: {type(exc).__name__}: {exc}"
        conn.send(PredictError(request_id=message.request_id, error=error, bad_input=True))
        return
    key = _OPTIONS_ENCODER.encode(message.options).decode()
    batcher.add(
        PendingRequest(message.request_id, prepared, message.options, key, time.monotonic())
    )


def _run_batch(conn: Any, backend: Any, batch: Batch) -> None:
    """One backend call; if it raises, the requests run again in halves down to the one(s)
    that make it fail, which get the error (ValueError: bad input, 400; else a server error)."""
    start = time.monotonic()
    try:
        outputs = backend.infer(batch.items, batch.options)
    except Exception as exc:
        if len(batch.requests) > 1:
            half = len(batch.requests) // 2
            _run_batch(conn, backend, Batch(batch.requests[:half]))
            _run_batch(conn, backend, Batch(batch.requests[half:]))
            return
        bad = isinstance(exc, ValueError)
        error = (
            str(exc) if bad else f"this request failed in the model: {type(exc).__name__}: {exc}"
        )
        conn.send(PredictError(request_id=batch.requests[0].request_id, error=error, bad_input=bad))
        return
    compute_s = time.monotonic() - start
    offset = 0
    for request in batch.requests:
        count = len(request.items)
        conn.send(
            PredictResult(
                request_id=request.request_id,
                outputs=outputs[offset : offset + count],
                queue_s=start - request.arrival,
                compute_s=compute_s,
                batch_size=batch.size,
            )
        )
        offset += count
