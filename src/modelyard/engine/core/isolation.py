"""Find the requests that make a step fail, so that they fail alone (EngineCore.step's last line).

Bad input is refused at the edge (the API process, then `Scheduler.add_request`), but a request
can still make the runner raise. Without isolation every request of that batch, other tenants'
streams included, would fail with it. When `runner.execute(batch)` raises, `isolate_failure`:

1. orders the batch's members in layers: a member that reads KV blocks another member writes in
   this step (n > 1 siblings, prompts sharing a prefix admitted in the same step) comes in a
   later layer than that writer;
2. runs each layer again by bisection: a group that runs gives its sampled tokens; a group that
   fails is split in halves, down to single members, and a member that fails alone is a
   culprit. (A lone layer is the batch that already failed: it starts from its halves.)
3. a member whose writer failed cannot run this step (the KV it would read was never written):
   it is recomputed later, as after a preemption, and does not fail.

It returns the sampled tokens of every member that ran (one RunnerOutput for the batch), the
culprits' error messages for `Scheduler.fail_requests`, and the members to recompute.

Running members again is safe: a step writes each KV slot with a value that depends only on the
request's own tokens and positions, so a second run writes the same values, and the runner's
per-request state (seeded generators) advances only when sampling, after the forward succeeded.
A speculating member proposes again (a draft model's greedy proposal over the same KV is the
same) and its verified drafts come back with its sampled token.
A batch whose every member fails (a runner bug, not a request) costs about twice its size in
extra steps and fails them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from modelyard.engine.core.scheduler_output import (
    RunnerOutput,
    ScheduledRequest,
    SchedulerOutput,
    StepRunner,
)


@dataclass(slots=True)
class Isolation:
    """What isolating a failed step found."""

    output: RunnerOutput = field(default_factory=RunnerOutput)  # tokens of the members that ran
    errors: dict[str, str] = field(default_factory=dict)  # culprit request id -> error message
    recompute: list[str] = field(default_factory=list)  # members whose writer failed


def isolate_failure(
    runner: StepRunner, batch: SchedulerOutput, error: Exception, block_size: int
) -> Isolation:
    """Re-run the failed `batch` in smaller groups (see the module docstring); `error` is what
    the whole batch raised (the culprit's message when the batch has a single member)."""
    result = Isolation()
    scheduled = batch.scheduled
    deps = dependencies(scheduled, block_size)
    layers = layers_of(deps)
    lost: set[int] = set()  # members that failed or must be recomputed
    for layer in layers:
        blocked = [i for i in layer if deps[i] & lost]
        runnable = [i for i in layer if not deps[i] & lost]
        lost.update(blocked)
        result.recompute += [scheduled[i].request_id for i in blocked]
        if len(layers) == 1 and len(runnable) == 1:
            _blame(scheduled[runnable[0]], error, result)
        else:
            _bisect(runner, batch, runnable, result, known_to_fail=len(layers) == 1)
        lost.update(i for i in runnable if scheduled[i].request_id in result.errors)
    return result


def dependencies(scheduled: Sequence[ScheduledRequest], block_size: int) -> list[set[int]]:
    """For each member, the other members whose blocks written this step it reads."""
    writer: dict[int, int] = {}  # block id -> index of the member that writes it this step
    for index, entry in enumerate(scheduled):
        first = entry.start_position // block_size
        for block in entry.block_table[first : _end_block(entry, block_size)]:
            writer.setdefault(block, index)
    deps: list[set[int]] = []
    for index, entry in enumerate(scheduled):
        read = (writer.get(block) for block in entry.block_table[: _end_block(entry, block_size)])
        deps.append({other for other in read if other is not None and other != index})
    return deps


def layers_of(deps: list[set[int]]) -> list[list[int]]:
    """Members in layers, each after the layers of every member it depends on; batch order
    inside a layer (decodes first, as the runner expects)."""
    layers: list[list[int]] = []
    placed: set[int] = set()
    remaining = list(range(len(deps)))
    while remaining:
        layer = [i for i in remaining if deps[i] <= placed] or remaining  # (no cycles exist)
        layers.append(layer)
        placed.update(layer)
        remaining = [i for i in remaining if i not in placed]
    return layers


def _end_block(entry: ScheduledRequest, block_size: int) -> int:
    """One past the last block the entry touches this step (its speculative slots included)."""
    last = entry.start_position + len(entry.token_ids) + entry.num_spec_tokens - 1
    return last // block_size + 1


def _bisect(
    runner: StepRunner,
    batch: SchedulerOutput,
    indices: list[int],
    result: Isolation,
    *,
    known_to_fail: bool = False,
) -> None:
    """Run `indices` as one step unless known to fail; on failure split in halves."""
    if not indices:
        return
    if not known_to_fail:
        try:
            output = runner.execute(_subset(batch, indices))
        except Exception as exc:
            if len(indices) == 1:
                _blame(batch.scheduled[indices[0]], exc, result)
                return
        else:
            result.output.sampled_token_ids.update(output.sampled_token_ids)
            result.output.logprobs.update(output.logprobs)
            result.output.drafts.update(output.drafts)  # speculation: accepted before sampled
            return
    half = len(indices) // 2
    _bisect(runner, batch, indices[:half], result)
    _bisect(runner, batch, indices[half:], result)


def _subset(batch: SchedulerOutput, indices: list[int]) -> SchedulerOutput:
    scheduled = [batch.scheduled[i] for i in indices]
    return SchedulerOutput(
        scheduled=scheduled,
        num_batched_tokens=sum(len(entry.token_ids) for entry in scheduled),
        finished_request_ids=batch.finished_request_ids,
        preempted_request_ids=batch.preempted_request_ids,
    )


def _blame(entry: ScheduledRequest, error: Exception, result: Isolation) -> None:
    message = f"this request failed in the engine: {type(error).__name__}: {error}"
    result.errors[entry.request_id] = message
