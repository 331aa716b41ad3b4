"""Fakes for the engine's process edge: a scripted core served by worker.serve in a thread,
joined to an EngineCoreClient by the in-process transport (no subprocess, no sockets)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from modelyard.engine.client.core_client import EngineCoreClient
from modelyard.engine.core.worker import serve
from modelyard.engine.messages import (
    COMMAND_CODEC,
    WORKER_MESSAGE_CODEC,
    EngineOutput,
    EngineReady,
    EngineRequest,
    FinishReason,
    PinPrefix,
    SchedulerStats,
)
from modelyard.engine.sampling_params import SamplingParams
from modelyard.transport.inproc import inproc_pair


class Killed(BaseException):
    """Raised inside the worker thread to simulate `kill -9` (serve does not catch it)."""


@dataclass
class _Running:
    request: EngineRequest
    produced: int = 0
    scheduled_at: float | None = None


@dataclass
class FakeCore:
    """Generates `tokens_per_step` tokens (1: plain decoding; more: like an accepted
    speculative run) per step per running request: script[request_id] if given, else the
    prompt ids cycled. Finishes with LENGTH at max_tokens or STOP at the script's end."""

    capacity: int = 8  # requests running at once; the rest wait (0: nothing ever runs)
    step_delay_s: float = 0.0
    num_blocks: int = 100
    script: dict[str, list[int]] = field(default_factory=dict)
    tokens_per_step: int = 1
    fail_next_step: bool = False
    killed: bool = False
    added: list[EngineRequest] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    requests: dict[str, _Running] = field(default_factory=dict)
    max_pinned_blocks: int = 4  # announced in EngineReady
    fail_pins: bool = False  # pin prefills fail like a refused request
    pinned: list[str] = field(default_factory=list)  # prefix ids of PinPrefix commands
    unpinned: list[str] = field(default_factory=list)  # prefix ids of UnpinPrefixes

    def add_request(self, request: EngineRequest) -> None:
        if not request.prompt_token_ids:
            raise ValueError("empty prompt")
        self.added.append(request)
        self.requests[request.request_id] = _Running(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.aborted.extend(request_ids)
        for rid in request_ids:
            self.requests.pop(rid, None)

    def pin_prefix(self, command: PinPrefix) -> None:
        """A pin prefills like a request with max_tokens=1."""
        if self.fail_pins:
            raise ValueError("pin refused")
        self.add_request(
            EngineRequest(
                request_id=command.request_id,
                prompt_token_ids=command.token_ids,
                sampling_params=SamplingParams(max_tokens=1),
            )
        )
        self.pinned.append(command.prefix_id)

    def unpin_prefixes(self, prefix_ids: list[str]) -> None:
        self.unpinned.extend(prefix_ids)

    def expire_pins(self) -> None:
        """No TTLs in the fake."""

    def has_unfinished_requests(self) -> bool:
        if self.killed:
            raise Killed
        return bool(self.requests)

    def step(self) -> list[EngineOutput]:
        if self.killed:
            raise Killed
        if self.fail_next_step:
            self.fail_next_step = False
            raise RuntimeError("boom")
        time.sleep(self.step_delay_s)
        outputs = []
        for rid, state in list(self.requests.items())[: self.capacity]:
            outputs.append(self._advance(rid, state))
        return outputs

    def _advance(self, rid: str, state: _Running) -> EngineOutput:
        req = state.request
        first = state.scheduled_at is None
        if first:
            state.scheduled_at = time.time()
        ids = self.script.get(rid) or req.prompt_token_ids
        tokens: list[int] = []
        finish = None
        while finish is None and len(tokens) < self.tokens_per_step:
            tokens.append(ids[state.produced % len(ids)])
            state.produced += 1
            if rid in self.script and state.produced >= len(ids):
                finish = FinishReason.STOP
            elif state.produced >= (req.sampling_params.max_tokens or 10**9):
                finish = FinishReason.LENGTH
        if finish is not None:
            del self.requests[rid]
        return EngineOutput(
            request_id=rid,
            new_token_ids=tokens,
            finish_reason=finish,
            num_prompt_tokens=len(req.prompt_token_ids),
            first_scheduled_time=state.scheduled_at if first else None,
        )

    def stats(self) -> SchedulerStats:
        running = min(len(self.requests), self.capacity)
        return SchedulerStats(
            num_running=running,
            num_waiting=len(self.requests) - running,
            num_blocks=self.num_blocks,
            num_free_blocks=self.num_blocks - 2 * running,
        )


class ThreadWorker:
    """A WorkerHandle backed by a thread running worker.serve."""

    def __init__(self, core: FakeCore) -> None:
        self.core = core
        self.exitcode: int | None = None
        api, self.conn = inproc_pair(COMMAND_CODEC, WORKER_MESSAGE_CODEC)
        self.api_conn = api
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        ready = EngineReady(
            num_blocks=self.core.num_blocks,
            block_size=16,
            max_model_len=64,
            tokenizer_path="",
            model_path="",
            dtype="float32",
            implementation="fake",
            rss_bytes=0,
            max_pinned_blocks=self.core.max_pinned_blocks,
        )
        self.conn.send(ready)
        try:
            self.exitcode = serve(self.core, self.conn)
        except BaseException:
            self.exitcode = -9

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def terminate(self) -> None:
        self.core.killed = True

    def kill(self) -> None:
        self.core.killed = True


async def start_fake_client(
    core: FakeCore, heartbeat_timeout_s: float = 5.0
) -> tuple[EngineCoreClient, ThreadWorker]:
    worker = ThreadWorker(core)
    worker.start()
    client = EngineCoreClient(worker.api_conn, worker, heartbeat_timeout_s=heartbeat_timeout_s)
    await client.wait_ready(5.0)
    return client, worker
