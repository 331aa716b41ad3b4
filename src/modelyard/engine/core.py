"""The engine core: one step is schedule -> execute -> update.

`EngineCore` knows nothing about processes, sockets or text: the worker process
(engine/worker.py) feeds it requests and aborts between steps and ships what `step()` returns.
Everything here runs on one thread; no method blocks except `step()` while the model runs.
"""

from __future__ import annotations

from collections.abc import Iterable

from modelyard.engine.config import EngineConfig
from modelyard.engine.messages import EngineOutput, EngineRequest, SchedulerStats
from modelyard.engine.scheduler import Scheduler
from modelyard.engine.scheduler_output import StepRunner
from modelyard.engine.spec_decode import SpecDecodePolicy


class EngineCore:
    """A scheduler wired to a model runner (the real one, or a fake in tests)."""

    def __init__(self, config: EngineConfig, runner: StepRunner) -> None:
        self.config = config
        self.runner = runner
        self.scheduler = Scheduler(
            config.scheduler,
            config.cache,
            num_blocks=runner.num_kv_blocks,
            max_model_len=runner.max_model_len,
            eos_token_ids=runner.eos_token_ids,
            spec_policy=SpecDecodePolicy(config.speculative, runner.max_model_len),
        )

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request. ValueError when it can never run: a prompt longer than the
        context length - 1, an empty prompt, a duplicate live id, invalid sampling params.
        (The API process checks first; this is the last line.)"""
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Drop these requests; their KV blocks are free before the next step."""
        self.scheduler.abort_requests(request_ids)

    def step(self) -> list[EngineOutput]:
        """Run one batch; one output per request that got a token. [] when nothing ran."""
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.is_empty:
            return []
        try:
            runner_output = self.runner.execute(scheduler_output)
        except BaseException:
            self.scheduler.discard(scheduler_output)  # no half-written KV in the prefix cache
            raise
        return self.scheduler.update(scheduler_output, runner_output)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def stats(self) -> SchedulerStats:
        return self.scheduler.stats()
