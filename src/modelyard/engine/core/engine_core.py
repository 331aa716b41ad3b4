"""The engine core: one step is schedule -> execute -> update.

`EngineCore` knows nothing about processes, sockets or text: the worker process
(engine/core/worker.py) feeds it requests and aborts between steps and ships what `step()` returns.
Everything here runs on one thread; no method blocks except `step()` while the model runs.

A step whose execution raises fails only the requests that make it fail (engine/core/isolation.py
finds them); the rest of the batch gets its tokens as if nothing had happened.

Pinned prefixes (engine/core/prefixes.py) ride on the same step: a pin's prefill is an ordinary
request, pinned when its output passes through `step()`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

import msgspec

from modelyard.engine.config import EngineConfig
from modelyard.engine.core.isolation import isolate_failure
from modelyard.engine.core.prefixes import PrefixPins, pin_limit_blocks
from modelyard.engine.core.scheduler import Scheduler
from modelyard.engine.core.scheduler_output import (
    LoRARunner,
    RunnerOutput,
    SchedulerOutput,
    StepRunner,
    StructuredOutputStats,
)
from modelyard.engine.core.spec_decode import SpecDecodePolicy
from modelyard.engine.messages import (
    EngineOutput,
    EngineRequest,
    PinPrefix,
    SchedulerStats,
)

logger = logging.getLogger(__name__)


class EngineCore:
    """A scheduler wired to a model runner (the real one, or a fake in tests)."""

    def __init__(
        self,
        config: EngineConfig,
        runner: StepRunner,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock` times the pins' TTLs (tests pass a fake one)."""
        self.config = config
        self.runner = runner
        self._lora: LoRARunner | None = None
        if config.lora is not None:
            self._lora = runner.lora
            if self._lora is None:
                raise ValueError("this runner cannot serve LoRA adapters")
        self.scheduler = Scheduler(
            config.scheduler,
            config.cache,
            num_blocks=runner.num_kv_blocks,
            max_model_len=runner.max_model_len,
            eos_token_ids=runner.eos_token_ids,
            spec_policy=SpecDecodePolicy(config.speculative, runner.max_model_len),
            max_loras=config.lora.max_loras if config.lora is not None else 0,
            vocab_size=runner.vocab_size,
        )
        kv = self.scheduler.kv_cache
        limit = pin_limit_blocks(
            kv.num_blocks,
            kv.block_size,
            self.scheduler.max_model_len,
            config.cache.max_pinned_fraction,
        )
        self.prefixes = PrefixPins(kv, limit, clock)
        self.num_computed_tokens = 0  # cumulative tokens run through the model
        self.structured = StructuredOutputStats()  # the runner's latest structured-output figures

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request. ValueError when it can never run: a prompt longer than the
        context length - 1, an empty prompt, a duplicate live id, invalid sampling params.
        (The API process checks first; this is the last line.) A LoRA adapter is loaded
        now, so one that does not fit the model fails only its request."""
        if request.lora is not None and self._lora is not None:
            self._lora.check_lora(request.lora)
        self.scheduler.add_request(request)

    def drop_loras(self, names: list[str]) -> None:
        """These adapters were unregistered: free their memory."""
        if self._lora is not None:
            self._lora.drop_loras(names)

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Drop these requests; their KV blocks are free before the next step."""
        request_ids = list(request_ids)
        self.scheduler.abort_requests(request_ids)
        self.prefixes.abandon(request_ids)

    def pin_prefix(self, command: PinPrefix) -> None:
        """Queue the prefill of a prefix to pin; its request's last output says how it went.
        PrefixBudgetError (a ValueError) over the pin budget, ValueError when it can never run."""
        request = self.prefixes.start(command)
        try:
            self.scheduler.add_request(request)
        except BaseException:
            self.prefixes.abandon([request.request_id])
            raise

    def unpin_prefixes(self, prefix_ids: Iterable[str]) -> None:
        """Release these pins now (unknown ids are ignored)."""
        self.prefixes.unpin(list(prefix_ids))

    def expire_pins(self) -> None:
        """Release the pins whose TTL has passed (the worker loop calls this every turn)."""
        self.prefixes.expire()

    def step(self) -> list[EngineOutput]:
        """Run one batch; one output per request that got a token or failed. [] when nothing
        ran."""
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.is_empty:
            return []
        failed: list[EngineOutput] = []
        try:
            runner_output = self.runner.execute(scheduler_output)
        except Exception as exc:
            runner_output, failed = self._isolate(scheduler_output, exc)
        except BaseException:
            self.scheduler.discard(scheduler_output)  # no half-written KV in the prefix cache
            raise
        self.num_computed_tokens += scheduler_output.num_batched_tokens
        self.structured = runner_output.structured or self.structured
        outputs = failed + self.scheduler.update(scheduler_output, runner_output)
        return [self.prefixes.finish(output) for output in outputs]

    def _isolate(
        self, scheduler_output: SchedulerOutput, exc: Exception
    ) -> tuple[RunnerOutput, list[EngineOutput]]:
        """The batch raised: re-run it in smaller groups to fail only the requests that make
        it fail (engine/core/isolation.py). (tokens of the rest, error outputs of the culprits)"""
        logger.exception("engine step failed; isolating the requests that make it fail")
        block_size = self.config.cache.block_size
        isolated = isolate_failure(self.runner, scheduler_output, exc, block_size)
        failed = self.scheduler.fail_requests(scheduler_output, isolated.errors, isolated.recompute)
        return isolated.output, failed

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def stats(self) -> SchedulerStats:
        kv = self.scheduler.kv_cache
        stats = msgspec.structs.replace(
            self.scheduler.stats(),
            num_computed_tokens=self.num_computed_tokens,
            num_pinned_blocks=kv.num_pinned_blocks,
            num_pinned_prefixes=len(self.prefixes),
            pinned_prefix_hits=kv.pinned_hits,
            prefix_hits=self.prefixes.hits(),
            structured_requests=self.structured.constrained_requests,
            structured_compile_seconds=self.structured.compile_seconds,
            structured_mask_seconds=self.structured.mask_seconds,
            structured_mask_steps=self.structured.mask_steps,
        )
        if self._lora is not None:
            self._lora.fill_lora_stats(stats)
        return stats
