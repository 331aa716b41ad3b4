"""The engine worker process: builds the model runner and the engine core, then serves.

`run_engine_worker` is the process entry (the API process names it through
engine/worker_entry.py and starts it in a fresh interpreter, transport/spawn.py). It connects
to the API process's IPC sockets, loads the model, sends `EngineReady` (or `EngineFailed` and
exits 1), then runs `serve`:

    drain every pending command (non-blocking; a PinPrefix queues the prefix's prefill,
    UnpinPrefixes releases pins), then release the pins whose TTL passed
    -> if there is work: core.step(), send EngineOutputs(outputs, stats)
    -> else: block on the command socket for a short while; send an empty EngineOutputs as a
       heartbeat every HEARTBEAT_INTERVAL_S so the client can tell the worker is alive.
    While a step runs, a pulse thread sends `Heartbeat`s (up to MAX_STEP_S into the step).

`Shutdown` ends the loop with exit status 0. A request that makes a step fail fails alone
(the core isolates it, engine/core/isolation.py). Should `core.step()` raise all the same,
every live request gets a FinishReason.ERROR output and the worker keeps serving; an exception
while doing that (or anything else unexpected) propagates and the process exits non-zero.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import psutil

from modelyard.engine.config import EngineConfig
from modelyard.engine.messages import (
    COMMAND_CODEC,
    WORKER_MESSAGE_CODEC,
    AbortRequests,
    DropLoRAs,
    EngineCommand,
    EngineFailed,
    EngineOutput,
    EngineOutputs,
    EngineReady,
    EngineRequest,
    FinishReason,
    Heartbeat,
    PinPrefix,
    SchedulerStats,
    Shutdown,
    UnpinPrefixes,
    WorkerMessage,
)
from modelyard.transport.base import SyncConnection
from modelyard.transport.signals import ignore_group_signals
from modelyard.transport.zmq_ipc import IpcAddresses, SyncZmqConnection

logger = logging.getLogger(__name__)

#: Seconds between heartbeats while idle (the client declares the worker dead after a timeout).
HEARTBEAT_INTERVAL_S = 0.5
#: A step running longer than this gets no more heartbeats (a hung worker is found).
MAX_STEP_S = 600.0
#: Longest block on the command socket while idle.
IDLE_POLL_S = 0.05

WorkerConnection = SyncConnection[WorkerMessage, EngineCommand]


class Core(Protocol):
    """What the loop needs from engine.core.engine_core.EngineCore (tests pass fakes)."""

    def add_request(self, request: EngineRequest) -> None: ...

    def abort_requests(self, request_ids: list[str]) -> None: ...

    def drop_loras(self, names: list[str]) -> None: ...
    def pin_prefix(self, command: PinPrefix) -> None: ...

    def unpin_prefixes(self, prefix_ids: list[str]) -> None: ...

    def expire_pins(self) -> None: ...

    def step(self) -> list[EngineOutput]: ...

    def has_unfinished_requests(self) -> bool: ...

    def stats(self) -> SchedulerStats: ...


def run_engine_worker(config: EngineConfig, addresses: IpcAddresses) -> None:
    """Process entry: load, announce readiness, serve until Shutdown; exit status says how."""
    ignore_group_signals()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    conn: SyncZmqConnection[WorkerMessage, EngineCommand] = SyncZmqConnection(
        addresses, WORKER_MESSAGE_CODEC, COMMAND_CODEC
    )
    try:
        core, ready = _build(config)
    except Exception as exc:
        logger.exception("engine worker failed to start")
        conn.send(EngineFailed(error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        time.sleep(0.2)  # let the message leave before the sockets close
        conn.close()
        sys.exit(1)
    conn.send(ready)
    # the model, tokenizer and transformers' modules are long-lived: freezing them keeps the
    # collector from re-walking them in every full collection during serving
    gc.collect()
    gc.freeze()
    try:
        code = serve(core, conn, parent_pid=os.getppid())
    finally:
        conn.close()
    sys.exit(code)


def _build(config: EngineConfig) -> tuple[Core, EngineReady]:
    from modelyard.engine.core.engine_core import EngineCore
    from modelyard.runner.model_runner import ModelRunner

    runner = ModelRunner(
        config.model, config.cache, config.speculative, config.lora, kernels=config.kernels
    )
    core = EngineCore(config, runner)
    ready = EngineReady(
        num_blocks=runner.num_kv_blocks,
        block_size=config.cache.block_size,
        max_model_len=runner.max_model_len,
        tokenizer_path=str(runner.tokenizer_path),
        model_path=str(runner.model_path),
        dtype=config.model.dtype,
        implementation=runner.implementation,
        rss_bytes=psutil.Process().memory_info().rss,
        vocab_size=runner.vocab_size,
        max_pinned_blocks=core.prefixes.limit_blocks,
    )
    return core, ready


class StepPulse:
    """A daemon thread that sends a `Heartbeat` every HEARTBEAT_INTERVAL_S while one step runs,
    so a long step (a big prefill on a busy host) is not taken for a hung worker. A step past
    MAX_STEP_S gets no more pulses: the client's heartbeat timeout then finds it."""

    def __init__(self, conn: WorkerConnection) -> None:
        self._conn = conn
        self._step_started: float | None = None  # time.monotonic() of the running step
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-pulse", daemon=True)

    def __enter__(self) -> StepPulse:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    @contextmanager
    def step(self) -> Iterator[None]:
        self._step_started = time.monotonic()
        try:
            yield
        finally:
            self._step_started = None

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_INTERVAL_S):
            started = self._step_started
            if started is not None and 0 < time.monotonic() - started < MAX_STEP_S:
                self._conn.send(Heartbeat(timestamp=time.time()))


def serve(core: Core, conn: WorkerConnection, *, parent_pid: int | None = None) -> int:
    """The busy loop; returns the exit status (0 after Shutdown, 1 when the parent is gone)."""
    with StepPulse(conn) as pulse:
        return _serve(core, conn, pulse, parent_pid)


def _serve(core: Core, conn: WorkerConnection, pulse: StepPulse, parent_pid: int | None) -> int:
    live: set[str] = set()  # requests added and not finished: the ones a failed step fails
    last_sent = 0.0
    while True:
        busy = core.has_unfinished_requests()
        command = conn.recv(0 if busy else IDLE_POLL_S)
        while command is not None:
            if isinstance(command, Shutdown):
                return 0
            _apply(core, command, live, conn)
            command = conn.recv(0)
        core.expire_pins()
        outputs: list[EngineOutput] = []
        if core.has_unfinished_requests():
            with pulse.step():
                outputs = _step(core, live)
        now = time.time()
        if outputs or now - last_sent >= HEARTBEAT_INTERVAL_S:
            conn.send(EngineOutputs(outputs=outputs, stats=core.stats(), timestamp=now))
            last_sent = now
            if parent_pid is not None and os.getppid() != parent_pid:
                return 1  # orphaned: the API process died without a Shutdown


def _apply(core: Core, command: EngineCommand, live: set[str], conn: WorkerConnection) -> None:
    if isinstance(command, EngineRequest | PinPrefix):
        try:
            if isinstance(command, PinPrefix):
                core.pin_prefix(command)
            else:
                core.add_request(command)
        except Exception as exc:  # a bad request fails alone
            logger.warning("request %s refused: %s", command.request_id, exc)
            failed = _error_output(command.request_id, exc)
            conn.send(EngineOutputs(outputs=[failed], stats=core.stats(), timestamp=time.time()))
            return
        live.add(command.request_id)
    elif isinstance(command, AbortRequests):
        core.abort_requests(command.request_ids)
        live.difference_update(command.request_ids)
    elif isinstance(command, DropLoRAs):
        core.drop_loras(command.names)
    elif isinstance(command, UnpinPrefixes):
        core.unpin_prefixes(command.prefix_ids)


def _step(core: Core, live: set[str]) -> list[EngineOutput]:
    """core.step(); should it raise (the core isolates a failing request itself, so this is a
    bug), abort and fail every live request: the step's batch is not known from outside."""
    try:
        outputs = core.step()
    except Exception as exc:
        logger.exception("engine step failed; failing %d live requests", len(live))
        failed = sorted(live)
        core.abort_requests(failed)
        live.clear()
        return [_error_output(request_id, exc) for request_id in failed]
    for output in outputs:
        if output.finish_reason is not None:
            live.discard(output.request_id)
    return outputs


def _error_output(request_id: str, exc: BaseException) -> EngineOutput:
    return EngineOutput(
        request_id=request_id,
        new_token_ids=[],
        finish_reason=FinishReason.ERROR,
        error=f"engine error: {type(exc).__name__}: {exc}",
    )
