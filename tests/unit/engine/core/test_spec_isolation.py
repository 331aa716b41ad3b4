"""Speculative decoding meets the engine's isolation (engine/core/isolation.py), no model: a step
that fails is re-run in parts, a speculating request that ran keeps its accepted drafts, and a
speculating request that made the step fail gives its reserved slots back."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import pytest

from modelyard.engine.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from modelyard.engine.core.engine_core import EngineCore
from modelyard.engine.core.scheduler_output import DraftResult, RunnerOutput, SchedulerOutput
from modelyard.engine.messages import EngineRequest
from modelyard.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit

BS = 4
NUM_BLOCKS = 64
POISON = 4242
K = 3  # speculative slots per step
ACCEPTED = 2  # drafts the fake target accepts per step (the third is wrong)


def target_token(request_id: str, position: int) -> int:
    """The fake target's greedy token at `position` (never 0..99, so never EOS=2)."""
    return 100 + zlib.crc32(f"{request_id}:{position}".encode()) % 5000


@dataclass
class FakeSpecRunner:
    """A target whose greedy token depends on (request, position) only, with a proposer that
    guesses the first ACCEPTED tokens right; a step holding POISON, or a speculating request in
    `fail_when_speculating`, raises."""

    num_kv_blocks: int = NUM_BLOCKS
    max_model_len: int = 512
    eos_token_ids: list[int] = field(default_factory=lambda: [2])
    vocab_size: int = 10_000
    fail_when_speculating: set[str] = field(default_factory=set)
    num_spec_steps: int = 0  # steps that ran with at least one speculating request

    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        output = RunnerOutput()
        for s in scheduler_output.scheduled:
            known = [*s.prompt_token_ids, *s.output_token_ids]
            end = s.start_position + len(s.token_ids)
            assert list(s.token_ids) == known[s.start_position : end], s.request_id
            if POISON in s.token_ids or (
                s.num_spec_tokens and s.request_id in self.fail_when_speculating
            ):
                raise RuntimeError(f"bad request {s.request_id}")
            if not s.sample:
                continue
            right = [target_token(s.request_id, end + i) for i in range(s.num_spec_tokens)]
            drafts = [t if i < ACCEPTED else t + 1 for i, t in enumerate(right)]
            num_accepted = min(ACCEPTED, s.num_spec_tokens)
            if s.num_spec_tokens:
                output.drafts[s.request_id] = DraftResult(drafts, num_accepted)
            output.sampled_token_ids[s.request_id] = target_token(s.request_id, end + num_accepted)
        self.num_spec_steps += any(s.num_spec_tokens for s in scheduler_output.scheduled)
        return output


def make_core(runner: FakeSpecRunner) -> EngineCore:
    config = EngineConfig(
        model=ModelConfig(model="fake"),
        cache=CacheConfig(block_size=BS),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64),
        speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=K),
    )
    return EngineCore(config, runner)


def request(request_id: str, prompt: list[int], *, speculate: bool) -> EngineRequest:
    params = SamplingParams(max_tokens=12, speculate=speculate, ignore_eos=True)
    return EngineRequest(request_id=request_id, prompt_token_ids=prompt, sampling_params=params)


def drive(
    core: EngineCore, arrivals: dict[int, EngineRequest]
) -> tuple[dict[str, list[int]], dict[str, str]]:
    """Run to completion, each request joining at its step: tokens and errors per request."""
    tokens: dict[str, list[int]] = {}
    errors: dict[str, str] = {}
    for step_no in range(200):
        if step_no in arrivals:
            core.add_request(arrivals[step_no])
        for output in core.step():
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
            if output.error is not None:
                errors[output.request_id] = output.error
        if step_no > max(arrivals) and not core.has_unfinished_requests():
            return tokens, errors
    raise AssertionError("no progress")


def reference(request_id: str, num_prompt: int) -> list[int]:
    return [target_token(request_id, num_prompt + i) for i in range(12)]


def test_a_speculating_request_keeps_its_accepted_drafts_when_a_batch_mate_fails() -> None:
    runner = FakeSpecRunner()
    core = make_core(runner)
    good = request("good", list(range(300, 309)), speculate=True)
    bad = request("bad", [310, 311, POISON, 312], speculate=False)
    tokens, errors = drive(core, {0: good, 1: bad})  # bad's prefill joins good's first spec step
    assert tokens["good"] == reference("good", 9)
    assert list(errors) == ["bad"]
    assert tokens["bad"] == []
    assert runner.num_spec_steps == 4
    stats = core.stats()
    # 1 token from the prefill, then 3 + 3 + 3 + 2 (the last capped by max_tokens)
    assert (stats.spec_decode_num_drafts, stats.spec_decode_num_accepted_tokens) == (4, 7)
    assert (stats.num_failed_requests, stats.num_free_blocks) == (1, NUM_BLOCKS)


def test_a_speculating_request_that_fails_gives_its_slots_back() -> None:
    runner = FakeSpecRunner(fail_when_speculating={"spec"})
    core = make_core(runner)
    core.add_request(request("spec", list(range(400, 409)), speculate=True))
    core.add_request(request("plain", list(range(500, 506)), speculate=False))
    core.step()  # both prefills; the next step speculates for "spec" and fails it
    (error,) = [o for o in core.step() if o.error is not None]
    assert error.request_id == "spec"
    plain = core.scheduler.requests["plain"]
    assert list(core.scheduler.requests) == ["plain"]
    assert core.scheduler.kv_cache.num_free_blocks == NUM_BLOCKS - len(plain.block_ids)
    tokens, errors = drive(core, {0: request("after", list(range(600, 607)), speculate=True)})
    assert errors == {}
    assert tokens["after"] == reference("after", 7)
    assert plain.output_token_ids == reference("plain", 6)
    assert core.stats().num_free_blocks == NUM_BLOCKS
