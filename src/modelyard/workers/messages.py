"""Wire messages between the API process and a non-LLM model's worker process (msgspec)."""

from __future__ import annotations

from typing import Any

import msgspec


class PredictRequest(msgspec.Struct, tag="predict", kw_only=True):
    """API -> worker: one request's items."""

    request_id: int  # unique per worker connection, echoed in the reply
    inputs: list[Any]  # items of the model's kind (str, bytes, or named tensors)
    options: dict[str, Any] = {}  # per-request options (top_k, labels, ...)


class StopWorker(msgspec.Struct, tag="stop", kw_only=True):
    """API -> worker: finish, close the backend (e.g. unload in Triton) and exit."""


class WorkerReady(msgspec.Struct, tag="ready", kw_only=True):
    """Worker -> API, once: the backend loaded."""

    pid: int  # the worker's process id
    rss_bytes: int  # the worker's resident memory after load
    metadata: dict[str, Any]  # the backend's KServe-style tensor metadata


class WorkerFailed(msgspec.Struct, tag="failed", kw_only=True):
    """Worker -> API, instead of WorkerReady: the backend could not load."""

    error: str  # "<ExceptionType>: <message>"


class PredictResult(msgspec.Struct, tag="result", kw_only=True):
    """Worker -> API: one request's outputs and how it was served."""

    request_id: int  # from the PredictRequest
    outputs: list[Any]  # one per input item, shaped per kind (backends/base.py)
    queue_s: float  # time in the batcher's queue
    compute_s: float  # duration of the backend call of its batch
    batch_size: int  # items in that backend call


class PredictError(msgspec.Struct, tag="error", kw_only=True):
    """Worker -> API: the request failed."""

    request_id: int  # from the PredictRequest
    error: str  # human-readable reason
    bad_input: bool  # True: the client's input was wrong (HTTP 400); False: server error


ToWorker = PredictRequest | StopWorker
FromWorker = WorkerReady | WorkerFailed | PredictResult | PredictError
