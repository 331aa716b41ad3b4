"""Speculative decoding in the scheduler, driven by hand-made RunnerOutputs (no model): slot
reservation, the policy, rollback of rejected slots, stop checks inside an accepted run,
preemption, prefix caching and stats."""

from __future__ import annotations

import pytest

from modelyard.engine.config import CacheConfig, SchedulerConfig, SpeculativeConfig
from modelyard.engine.constraints import regex
from modelyard.engine.core.request import Request
from modelyard.engine.core.scheduler import Scheduler
from modelyard.engine.core.scheduler_output import DraftResult, RunnerOutput, SchedulerOutput
from modelyard.engine.core.spec_decode import SpecDecodePolicy, best_k
from modelyard.engine.messages import EngineRequest
from modelyard.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit

BS = 4
EOS = 2


def make_scheduler(
    *, k: int = 3, num_blocks: int = 64, max_model_len: int = 256, **spec: object
) -> Scheduler:
    config = SpeculativeConfig(method="ngram", num_speculative_tokens=k, **spec)  # type: ignore[arg-type]
    return Scheduler(
        SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=64),
        CacheConfig(block_size=BS),
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        eos_token_ids=[EOS],
        spec_policy=SpecDecodePolicy(config, max_model_len),
    )


def make_request(
    request_id: str, prompt_len: int = 5, priority: int = 0, **params: object
) -> EngineRequest:
    params.setdefault("max_tokens", 100)
    return EngineRequest(
        priority=priority,
        request_id=request_id,
        prompt_token_ids=[100 * (1 + ord(request_id[0])) + i for i in range(prompt_len)],
        sampling_params=SamplingParams(**params),  # type: ignore[arg-type]
    )


def run(
    sched: Scheduler, sampled: int = 7, drafts: dict[str, DraftResult] | None = None
) -> tuple[SchedulerOutput, dict[str, list[int]]]:
    out = sched.schedule()
    runner = RunnerOutput(
        sampled_token_ids={s.request_id: sampled for s in out.scheduled if s.sample},
        drafts=drafts or {},
    )
    return out, {o.request_id: o.new_token_ids for o in sched.update(out, runner)}


def test_decode_reserves_slots_and_accepted_tokens_come_before_the_sampled_one() -> None:
    sched = make_scheduler(k=3)
    sched.add_request(make_request("a", 6))
    out, _ = run(sched, sampled=50)  # prefill: no speculation
    assert out.scheduled[0].num_spec_tokens == 0
    request = sched.requests["a"]
    out = sched.schedule()
    (entry,) = out.scheduled
    assert (list(entry.token_ids), entry.num_spec_tokens) == ([50], 3)
    assert out.num_batched_tokens == 4
    assert request.num_computed_tokens == 6 + 1 + 3
    assert len(request.block_ids) == 3  # 10 positions in blocks of 4
    runner = RunnerOutput(sampled_token_ids={"a": 99}, drafts={"a": DraftResult([60, 61, 62], 2)})
    (output,) = sched.update(out, runner)
    assert output.new_token_ids == [60, 61, 99]
    assert request.num_computed_tokens == 6 + 1 + 2  # the rejected slot rolled back
    assert len(request.block_ids) == 3  # 9 computed positions still need 3 blocks
    stats = sched.stats()
    assert (stats.spec_decode_num_drafts, stats.spec_decode_num_draft_tokens) == (1, 3)
    assert stats.spec_decode_num_accepted_tokens == 2
    assert stats.spec_decode_num_accepted_tokens_per_pos == [1, 1]
    assert stats.spec_decode_method == "ngram"


def test_rejected_slots_give_their_blocks_back() -> None:
    sched = make_scheduler(k=4)
    sched.add_request(make_request("a", 4))  # prefill fills block 0 exactly
    run(sched)
    free_before = sched.kv_cache.num_free_blocks
    out = sched.schedule()
    assert out.scheduled[0].num_spec_tokens == 4
    assert sched.kv_cache.num_free_blocks == free_before - 2  # positions 4..8 -> blocks 1, 2
    runner = RunnerOutput(sampled_token_ids={"a": 9}, drafts={"a": DraftResult([1, 3, 4, 5], 0)})
    (output,) = sched.update(out, runner)
    assert output.new_token_ids == [9]
    assert sched.requests["a"].num_computed_tokens == 5
    assert sched.kv_cache.num_free_blocks == free_before - 1


def _verify_step(sched: Scheduler, proposed: int, accepted: int) -> int:
    """One decode of request "a" whose draft of `proposed` tokens keeps `accepted`; the
    slots the step gave it."""
    out = sched.schedule()
    slots = out.scheduled[0].num_spec_tokens
    draft = DraftResult(list(range(60, 60 + proposed)), accepted)
    sched.update(out, RunnerOutput(sampled_token_ids={"a": 9}, drafts={"a": draft}))
    return slots


def test_k_follows_each_requests_acceptance() -> None:
    sched = make_scheduler(k=8)
    sched.add_request(make_request("a", 5, max_tokens=200))
    run(sched)
    assert [_verify_step(sched, 8, 0), _verify_step(sched, 1, 0)] == [8, 1]  # drafts fail
    run(sched)  # a step with nothing proposed leaves k as it was
    assert sched.requests["a"].spec_k == 1
    # whole drafts accepted: the rate climbs back (0.41, 0.82) and k with it
    assert [_verify_step(sched, k, k) for k in (1, 3, 8)] == [1, 3, 8]
    assert _verify_step(sched, 8, 5) == 8  # a draft that mostly holds keeps k
    assert sched.requests["a"].spec_k == 8


@pytest.mark.parametrize(
    ("acceptance", "k"), [(0.0, 1), (0.05, 1), (0.2, 2), (0.5, 4), (0.75, 8), (1.0, 8)]
)
def test_best_k_trades_rows_for_expected_tokens(acceptance: float, k: int) -> None:
    assert best_k(acceptance, 8) == k
    assert best_k(acceptance, 3) == min(k, 3)


def test_k_stays_fixed_without_adaptive() -> None:
    sched = make_scheduler(k=4, adaptive=False)
    sched.add_request(make_request("a", 5))
    run(sched)
    assert [_verify_step(sched, 4, 0) for _ in range(3)] == [4, 4, 4]


def test_nothing_proposed_rolls_every_slot_back_and_counts_no_draft() -> None:
    sched = make_scheduler(k=3)
    sched.add_request(make_request("a", 5))
    run(sched)
    _, outs = run(sched, sampled=8)  # the runner proposed nothing: no drafts entry
    assert outs == {"a": [8]}
    assert sched.requests["a"].num_computed_tokens == 6
    assert sched.stats().spec_decode_num_drafts == 0


@pytest.mark.parametrize(
    ("params", "accepted", "expected", "reason"),
    [
        ({"stop_token_ids": [61]}, [60, 61, 62], [60, 61], "stop"),
        ({}, [60, EOS, 62], [60, EOS], "stop"),
        ({"max_tokens": 3}, [60, 61], [60, 61], "length"),
    ],
)
def test_a_stop_inside_the_accepted_run_ends_the_request_there(
    params: dict[str, object], accepted: list[int], expected: list[int], reason: str
) -> None:
    params.setdefault("max_tokens", 100)
    sched = make_scheduler(k=3)
    sched.add_request(make_request("a", 5, speculate=True, **params))
    run(sched, sampled=50)
    out = sched.schedule()
    k = out.scheduled[0].num_spec_tokens
    draft = DraftResult(accepted + [70] * (k - len(accepted)), len(accepted))
    outputs = sched.update(out, RunnerOutput(sampled_token_ids={"a": 99}, drafts={"a": draft}))
    assert outputs[0].new_token_ids == expected
    assert outputs[0].finish_reason == reason
    assert not sched.has_unfinished_requests()
    assert sched.kv_cache.num_free_blocks == sched.kv_cache.num_blocks


def test_slots_never_pass_max_tokens_or_the_context_length() -> None:
    sched = make_scheduler(k=8, max_model_len=12)
    sched.add_request(make_request("a", 5, max_tokens=5, speculate=True))
    run(sched)  # 1 output; 4 left: 3 drafts + the target's token
    assert sched.schedule().scheduled[0].num_spec_tokens == 3
    sched = make_scheduler(k=8, max_model_len=9)
    sched.add_request(make_request("a", 5, max_tokens=None))
    run(sched)  # 6 tokens, room for 3 more: 2 drafts + 1
    assert sched.schedule().scheduled[0].num_spec_tokens == 2


def policy_slots(params: dict[str, object], running: int = 1) -> int:
    policy = SpecDecodePolicy(
        SpeculativeConfig(
            method="ngram", num_speculative_tokens=4, long_output_tokens=64, disable_by_batch_size=4
        ),
        max_model_len=1024,
    )
    request = Request.from_engine_request(make_request("a", 5, **params))
    request.append_output_token(7)
    return policy.num_spec_tokens(request) if policy.step_allows(running) else 0


@pytest.mark.parametrize(
    ("params", "running", "slots"),
    [
        ({"max_tokens": 64}, 1, 4),  # a long output: speculates by default
        ({"max_tokens": None}, 1, 4),
        ({"max_tokens": 63}, 1, 0),  # a short one does not
        ({"max_tokens": 16, "speculate": True}, 1, 4),  # unless the request asks
        ({"max_tokens": 500, "speculate": False}, 1, 0),  # or opts out
        ({"max_tokens": 500, "logprobs": 2}, 1, 0),  # logprobs: never
        ({"max_tokens": 500, "speculate": True, "constraint": regex("a+")}, 1, 4),  # constrained
        ({"max_tokens": 500, "seed": 3}, 1, 0),  # a seeded sampled request only if it asks
        ({"max_tokens": 500, "seed": 3, "speculate": True}, 1, 4),
        ({"max_tokens": 500, "seed": 3, "temperature": 0.0}, 1, 4),
        ({"max_tokens": 500}, 4, 4),
        ({"max_tokens": 500}, 5, 0),  # a large batch: nobody speculates this step
    ],
)
def test_policy(params: dict[str, object], running: int, slots: int) -> None:
    assert policy_slots(params, running) == slots


def test_no_config_means_no_speculation() -> None:
    policy = SpecDecodePolicy(None, max_model_len=64)
    request = Request.from_engine_request(make_request("a", 5, speculate=True))
    assert not policy.step_allows(1)
    assert policy.num_spec_tokens(request) == 0


def test_batch_mixes_speculating_and_plain_decodes() -> None:
    sched = make_scheduler(k=2)
    sched.add_request(make_request("long", 5, max_tokens=200))
    sched.add_request(make_request("short", 5, max_tokens=10))
    run(sched)
    out = sched.schedule()
    assert {s.request_id: s.num_spec_tokens for s in out.scheduled} == {"long": 2, "short": 0}
    assert out.num_batched_tokens == 3 + 1


def test_speculation_never_preempts_and_falls_back_to_a_plain_decode() -> None:
    sched = make_scheduler(k=4, num_blocks=4)  # 16 slots
    sched.add_request(make_request("a", 7))
    sched.add_request(make_request("b", 7))
    run(sched)  # 2 blocks each: no block free
    out = sched.schedule()
    assert {s.request_id: s.num_spec_tokens for s in out.scheduled} == {"a": 0, "b": 0}
    assert sched.num_preemptions == 0


def test_preempted_ids_reach_the_runner_and_spec_slots_are_not_cached() -> None:
    sched = make_scheduler(k=3, num_blocks=6)
    sched.add_request(make_request("a", 8))
    run(sched)
    out = sched.schedule()  # a: positions 8..11 (1 real + 3 spec) fill block 2
    assert out.scheduled[0].num_spec_tokens == 3
    assert sched.kv_cache.num_cached_blocks == 2  # the spec-filled block is not published
    sched.update(out, RunnerOutput(sampled_token_ids={"a": 5}, drafts={}))
    sched.add_request(make_request("hi", 12, priority=1))  # preempts a for its blocks
    out = sched.schedule()
    assert sched.requests["a"].num_preemptions == 1
    assert out.preempted_request_ids == {"a"}
    assert sched.schedule().preempted_request_ids == set()
