"""A fault drill for the engine's isolation: a runner that fails on a poison token.

`with_poison(runner, token_ids)` wraps a StepRunner so that a step whose batch holds one of
`token_ids` raises before the model runs, the way a request that passed every check at the edge
could still break a step. Enabled only by the catalog option `poison_token_ids` of an LLM
(EngineConfig.poison_token_ids); the isolation tests use it through HTTP.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from modelyard.engine.core.scheduler_output import RunnerOutput, SchedulerOutput, StepRunner


class PoisonError(RuntimeError):
    """What a poisoned step raises."""


class PoisonedRunner:
    """A StepRunner that raises PoisonError for a batch holding a poison token id."""

    def __init__(self, runner: StepRunner, poison_token_ids: Iterable[int]) -> None:
        self.runner = runner
        self.poison = frozenset(poison_token_ids)

    @property
    def num_kv_blocks(self) -> int:
        return self.runner.num_kv_blocks

    @property
    def max_model_len(self) -> int:
        return self.runner.max_model_len

    @property
    def eos_token_ids(self) -> list[int]:
        return self.runner.eos_token_ids

    @property
    def vocab_size(self) -> int:
        return self.runner.vocab_size

    def __getattr__(self, name: str) -> Any:
        """The rest is the wrapped runner's (its LoRA methods, its paths)."""
        if name == "runner":  # not set yet (copy, unpickle): no recursion
            raise AttributeError(name)
        return getattr(self.runner, name)

    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        for entry in scheduler_output.scheduled:
            if not self.poison.isdisjoint(entry.token_ids):
                raise PoisonError(f"poison token in the step (request {entry.request_id})")
        return self.runner.execute(scheduler_output)


def with_poison(runner: StepRunner, poison_token_ids: Iterable[int]) -> StepRunner:
    """`runner` itself when there is no poison, else a PoisonedRunner around it."""
    poison = tuple(poison_token_ids)
    return PoisonedRunner(runner, poison) if poison else runner
