"""A fault drill for the engine's isolation: a runner that fails on a poison token.

`with_poison(runner, token_ids)` wraps a StepRunner so that a step whose batch holds one of
`token_ids` raises before the model runs, the way a request that passed every check at the edge
could still break a step. The unit tests wrap their fake runners with it; the isolation tests
(tests/e2e/api/hardening_server.py) call `install(token_ids)` in the server process, so every
engine worker it starts runs its real runner under the drill. Not part of modelyard.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from modelyard.engine.config import EngineConfig
from modelyard.engine.core.scheduler_output import RunnerOutput, SchedulerOutput, StepRunner
from modelyard.transport.zmq_ipc import IpcAddresses


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


def poisoned_worker_main(
    poison_token_ids: tuple[int, ...], config: EngineConfig, addresses: IpcAddresses
) -> None:
    """The engine worker's entry with the drill: its core runs a PoisonedRunner."""
    from modelyard.engine.core import engine_core
    from modelyard.engine.core.worker import run_engine_worker

    class PoisonedCore(engine_core.EngineCore):
        def __init__(self, config: EngineConfig, runner: StepRunner, **kwargs: Any) -> None:
            super().__init__(config, with_poison(runner, poison_token_ids), **kwargs)

    engine_core.EngineCore = PoisonedCore  # type: ignore[misc]  # this child process only
    run_engine_worker(config, addresses)


def install(poison_token_ids: Iterable[int]) -> None:
    """In the API process: every engine worker started from now on runs the drill. The entry
    is pickled by name to the child, which finds this module on the parent's sys.path."""
    from modelyard.engine.client import core_client

    core_client.worker_main = functools.partial(  # type: ignore[assignment]
        poisoned_worker_main, tuple(poison_token_ids)
    )
