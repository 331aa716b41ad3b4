"""Scheduler driven by hand-made RunnerOutputs (no model): batching, budgets, chunked prefill,
prefix caching, priorities, preemption, aborts and stats."""

import zlib
from collections.abc import Callable

import pytest

from modelyard.engine.config import CacheConfig, SchedulerConfig
from modelyard.engine.core.request import RequestStatus
from modelyard.engine.core.scheduler import Scheduler
from modelyard.engine.core.scheduler_output import RunnerOutput, SchedulerOutput
from modelyard.engine.messages import EngineOutput, EngineRequest
from modelyard.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit

BS = 4
EOS = 2


def make_scheduler(
    *,
    num_blocks: int = 64,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 256,
    prefix_caching: bool = True,
    chunked_prefill: bool = True,
) -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_chunked_prefill=chunked_prefill,
        ),
        CacheConfig(block_size=BS, enable_prefix_caching=prefix_caching),
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        eos_token_ids=[EOS],
    )


def prompt_of(request_id: str, length: int) -> list[int]:
    """Distinct tokens per request id, so that default prompts share no prefix."""
    base = 10_000 + 1000 * (zlib.crc32(request_id.encode()) % 1000)
    return [base + i for i in range(length)]


def make_request(
    request_id: str,
    prompt: int | list[int] = 5,
    *,
    priority: int = 0,
    arrival: float = 0.0,
    **params: object,
) -> EngineRequest:
    tokens = prompt if isinstance(prompt, list) else prompt_of(request_id, prompt)
    params.setdefault("max_tokens", 100)
    return EngineRequest(
        request_id=request_id,
        prompt_token_ids=tokens,
        sampling_params=SamplingParams(**params),  # type: ignore[arg-type]
        priority=priority,
        arrival_time=arrival,
    )


def sample(out: SchedulerOutput, token: int | Callable[[str], int] = 7) -> RunnerOutput:
    """A runner output that samples for every request with sample=True."""
    pick = token if callable(token) else (lambda _rid: token)
    return RunnerOutput(
        sampled_token_ids={s.request_id: pick(s.request_id) for s in out.scheduled if s.sample}
    )


def step(
    sched: Scheduler, token: int | Callable[[str], int] = 7
) -> tuple[SchedulerOutput, dict[str, EngineOutput]]:
    out = sched.schedule()
    outputs = sched.update(out, sample(out, token))
    return out, {o.request_id: o for o in outputs}


def tokens_of(out: SchedulerOutput) -> dict[str, int]:
    return {s.request_id: len(s.token_ids) for s in out.scheduled}


# ---------------------------------------------------------------- basic flow


def test_prefill_then_decode_positions_and_block_table() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("a", 6))
    out = sched.schedule()
    (entry,) = out.scheduled
    assert list(entry.token_ids) == prompt_of("a", 6)
    assert entry.start_position == 0
    assert entry.sample
    assert len(entry.block_table) == 2
    assert out.num_batched_tokens == 6
    outputs = sched.update(out, sample(out, 11))
    assert [o.new_token_ids for o in outputs] == [[11]]
    assert outputs[0].num_prompt_tokens == 6
    assert outputs[0].first_scheduled_time is not None
    out, outs = step(sched, 12)
    (entry,) = out.scheduled
    assert list(entry.token_ids) == [11]
    assert entry.start_position == 6
    assert list(entry.output_token_ids) == [11, 12]  # a live reference, updated by update()
    assert outs["a"].first_scheduled_time is None


def test_continuous_batching_join_mid_flight_and_leave_immediately() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("a", 4, max_tokens=3))
    step(sched)
    sched.add_request(make_request("b", 5, max_tokens=5))
    out, outs = step(sched)
    # b joins while a decodes; decodes come first in the batch.
    assert [s.request_id for s in out.scheduled] == ["a", "b"]
    assert tokens_of(out) == {"a": 1, "b": 5}
    assert set(outs) == {"a", "b"}
    out, outs = step(sched)
    assert outs["a"].finish_reason == "length"
    assert len(sched.requests) == 1
    blocks_in_use = sched.kv_cache.num_blocks - sched.kv_cache.num_free_blocks
    assert blocks_in_use == 2  # only b's blocks: a's were freed in update
    out, _ = step(sched)
    assert [s.request_id for s in out.scheduled] == ["b"]
    assert out.finished_request_ids == {"a"}
    out, _ = step(sched)
    assert out.finished_request_ids == set()


def test_token_budget_chunks_the_prompt_that_does_not_fit() -> None:
    sched = make_scheduler(max_num_batched_tokens=10)
    for rid in "abc":
        sched.add_request(make_request(rid, 6))
    out = sched.schedule()
    assert tokens_of(out) == {"a": 6, "b": 4}
    assert out.num_batched_tokens == 10
    assert [s.sample for s in out.scheduled] == [True, False]
    sched.update(out, sample(out))
    assert sched.num_waiting == 1
    out = sched.schedule()
    # a decodes (1), b finishes its prompt (2), c gets the rest of the budget (7 > 6: all).
    assert tokens_of(out) == {"a": 1, "b": 2, "c": 6}


def test_max_num_seqs_limits_running_requests() -> None:
    sched = make_scheduler(max_num_seqs=2)
    sched.add_request(make_request("a", 3, max_tokens=2))
    sched.add_request(make_request("b", 3, max_tokens=5))
    sched.add_request(make_request("c", 3, max_tokens=5))
    out, _ = step(sched)
    assert set(tokens_of(out)) == {"a", "b"}
    assert (sched.num_running, sched.num_waiting) == (2, 1)
    _, outs = step(sched)
    assert outs["a"].finish_reason == "length"
    out, _ = step(sched)
    assert tokens_of(out) == {"b": 1, "c": 3}


def test_chunked_prefill_samples_only_on_the_last_chunk() -> None:
    sched = make_scheduler(max_num_batched_tokens=8)
    sched.add_request(make_request("short", 3))
    step(sched)
    prompt = [500 + i for i in range(25)]
    sched.add_request(make_request("long", prompt))
    seen: list[int] = []
    starts, samples = [], []
    while True:
        out, outs = step(sched)
        assert out.num_batched_tokens <= 8
        assert tokens_of(out)["short"] == 1  # the decode keeps running alongside
        entry = next(s for s in out.scheduled if s.request_id == "long")
        starts.append(entry.start_position)
        samples.append(entry.sample)
        seen += entry.token_ids
        assert len(entry.block_table) * BS >= entry.start_position + len(entry.token_ids)
        if "long" in outs:
            break
    assert seen == prompt
    assert starts == [0, 7, 14, 21]
    assert samples == [False, False, False, True]


def test_chunking_disabled_waits_for_room() -> None:
    sched = make_scheduler(max_num_batched_tokens=10, chunked_prefill=False)
    sched.add_request(make_request("a", 6))
    sched.add_request(make_request("b", 6))
    out, _ = step(sched)
    assert tokens_of(out) == {"a": 6}
    out, _ = step(sched)
    assert tokens_of(out) == {"a": 1, "b": 6}


# ---------------------------------------------------------------- prefix caching


def test_shared_system_prompt_hits_the_prefix_cache() -> None:
    sched = make_scheduler()
    system = [300 + i for i in range(8)]
    sched.add_request(make_request("a", [*system, 1, 2, 3]))
    step(sched)
    sched.add_request(make_request("b", [*system, 4, 5]))
    out, outs = step(sched)
    a_entry, b_entry = out.scheduled
    assert b_entry.request_id == "b"
    assert b_entry.start_position == 8
    assert list(b_entry.token_ids) == [4, 5]
    assert list(b_entry.block_table[:2]) == list(a_entry.block_table[:2])
    kv = sched.kv_cache
    assert [kv.blocks[b].ref_count for b in b_entry.block_table] == [2, 2, 1]
    assert outs["b"].num_cached_tokens == 8
    assert outs["a"].num_cached_tokens == 0
    stats = sched.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (11 + 10, 8)


def test_cached_blocks_of_finished_requests_are_reused() -> None:
    sched = make_scheduler(num_blocks=8)
    system = [300 + i for i in range(8)]
    sched.add_request(make_request("a", [*system, 1], max_tokens=1))
    _, outs = step(sched)
    assert outs["a"].finish_reason == "length"
    assert sched.kv_cache.num_free_blocks == 8
    sched.add_request(make_request("b", [*system, 9, 9]))
    out, outs = step(sched)
    assert out.scheduled[0].start_position == 8
    assert outs["b"].num_cached_tokens == 8


def test_siblings_admitted_together_share_the_prompt_blocks_at_once() -> None:
    sched = make_scheduler()
    prompt = [300 + i for i in range(9)]
    for rid in ("s0", "s1", "s2"):  # n = 3 fanned out by the API process
        sched.add_request(make_request(rid, prompt))
    out = sched.schedule()
    assert tokens_of(out) == {"s0": 9, "s1": 1, "s2": 1}
    first, *others = out.scheduled
    for entry in others:
        assert entry.start_position == 8
        assert list(entry.block_table[:2]) == list(first.block_table[:2])
    assert sched.stats().prefix_cache_hits == 16


def test_preempted_victim_withdraws_blocks_published_this_step() -> None:
    # low's second block is filled by the chunk scheduled in this very step; when urgent
    # (same prompt) preempts low, that block must not serve urgent as a cache hit.
    sched = make_scheduler(num_blocks=3, max_num_batched_tokens=6)
    prompt = [300 + i for i in range(10)]
    sched.add_request(make_request("low", prompt, priority=0))
    step(sched)  # tokens 0..5: block 0 full and cached
    sched.add_request(make_request("urgent", prompt, priority=9))
    out = sched.schedule()  # low: tokens 6..9 (fills block 1), then urgent preempts it
    assert tokens_of(out) == {"urgent": 6}
    (entry,) = out.scheduled
    assert entry.start_position == 4  # only block 0 was really computed
    assert sched.requests["low"].status is RequestStatus.PREEMPTED


def test_no_prefix_hits_when_disabled() -> None:
    sched = make_scheduler(prefix_caching=False)
    system = [300 + i for i in range(8)]
    sched.add_request(make_request("a", [*system, 1]))
    step(sched)
    sched.add_request(make_request("b", [*system, 2]))
    out, _ = step(sched)
    assert out.scheduled[1].start_position == 0
    assert sched.stats().prefix_cache_hits == 0


# ---------------------------------------------------------------- priorities and preemption


def test_waiting_requests_admitted_by_priority_then_arrival() -> None:
    sched = make_scheduler(max_num_seqs=1)
    sched.add_request(make_request("low", 3, priority=0, arrival=1.0, max_tokens=1))
    sched.add_request(make_request("high-late", 3, priority=5, arrival=3.0, max_tokens=1))
    sched.add_request(make_request("high-early", 3, priority=5, arrival=2.0, max_tokens=1))
    order = []
    while sched.has_unfinished_requests():
        out, _ = step(sched)
        order += [s.request_id for s in out.scheduled]
    assert order == ["high-early", "high-late", "low"]


def test_preemption_picks_lowest_priority_then_latest_arrival() -> None:
    # 6 blocks of 4 tokens; three 7-token prompts take 2 blocks each; the first decode step
    # needs no new block (positions 7), the next one needs 1 block each -> preemption.
    sched = make_scheduler(num_blocks=6)
    sched.add_request(make_request("vip", 7, priority=1, arrival=3.0))
    sched.add_request(make_request("early", 7, arrival=1.0))
    sched.add_request(make_request("late", 7, arrival=2.0))
    step(sched, 40)
    assert sched.kv_cache.num_free_blocks == 0
    out, _ = step(sched, 41)  # positions 7: fits
    out = sched.schedule()  # positions 8: every request needs a new block
    assert sched.num_preemptions == 1
    late = next(r for r in sched.waiting if r.request_id == "late")
    assert late.status is RequestStatus.PREEMPTED
    assert late.num_computed_tokens == 0
    assert late.block_ids == []
    assert late.output_token_ids == [40, 41]  # outputs kept
    assert "late" not in tokens_of(out)
    assert tokens_of(out) == {"vip": 1, "early": 1}
    assert "late" not in out.finished_request_ids  # preemption is not finishing
    assert sched.stats().num_preemptions == sched.num_preemptions


def test_preempted_request_recomputes_prompt_and_outputs() -> None:
    sched = make_scheduler(num_blocks=4, max_num_seqs=2)
    sched.add_request(make_request("a", 7, arrival=1.0, max_tokens=4))
    sched.add_request(make_request("b", 7, arrival=2.0, max_tokens=4))
    step(sched, 40)
    step(sched, 41)
    out, _ = step(sched, 42)  # b is preempted, a continues
    assert tokens_of(out) == {"a": 1}
    while "b" not in tokens_of(out):
        out, _ = step(sched, 43)
    entry = next(s for s in out.scheduled if s.request_id == "b")
    # b re-prefills prompt + its 2 outputs (minus what the prefix cache still holds).
    full = [*prompt_of("b", 7), 40, 41]
    assert entry.start_position == 4  # b's first block survived in the prefix cache
    assert list(entry.token_ids) == full[4:]
    assert entry.sample


def test_higher_priority_waiting_request_preempts_strictly_lower() -> None:
    sched = make_scheduler(num_blocks=4)
    sched.add_request(make_request("low", 8, priority=0))
    sched.add_request(make_request("mid", 7, priority=1))
    step(sched)
    assert sched.kv_cache.num_free_blocks == 0
    sched.add_request(make_request("equal", 3, priority=1))
    out, _ = step(sched)
    assert "equal" not in tokens_of(out)  # same class: waits, no thrash
    sched.add_request(make_request("urgent", 3, priority=9))
    out = sched.schedule()
    assert "urgent" in tokens_of(out)
    assert "low" not in tokens_of(out)
    assert sched.requests["low"].status is RequestStatus.PREEMPTED
    assert sched.requests["mid"].status is RequestStatus.RUNNING


# ---------------------------------------------------------------- aborts


def test_abort_frees_blocks_and_reports_ids_to_the_runner() -> None:
    sched = make_scheduler(num_blocks=16, max_num_seqs=1)
    baseline = sched.kv_cache.num_free_blocks
    sched.add_request(make_request("running", 9))
    sched.add_request(make_request("queued", 9))
    sched.add_request(make_request("other", 3))
    step(sched)
    assert sched.kv_cache.num_free_blocks < baseline
    sched.abort_requests(["running", "queued", "unknown"])
    assert sched.kv_cache.num_free_blocks == baseline
    assert sched.num_waiting == 1
    out, _ = step(sched)
    assert tokens_of(out) == {"other": 3}
    assert out.finished_request_ids == {"running", "queued"}
    sched.abort_requests(["other"])
    assert not sched.has_unfinished_requests()
    assert sched.kv_cache.num_free_blocks == baseline
    out = sched.schedule()
    assert out.is_empty
    assert out.finished_request_ids == set()  # kept for the next batch that runs


# ---------------------------------------------------------------- stop conditions


def run_until_done(sched: Scheduler, tokens: list[int]) -> list[EngineOutput]:
    """Feed `tokens` one per step to the single request; return its outputs."""
    feed = iter(tokens)
    outputs: list[EngineOutput] = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        outputs += sched.update(out, sample(out, lambda _rid: next(feed)))
    return outputs


@pytest.mark.parametrize(
    ("params", "tokens", "expected_len", "reason", "stop_reason"),
    [
        ({}, [5, 6, EOS, 7], 3, "stop", None),
        ({"min_tokens": 3}, [5, EOS, 6, EOS, 7], 4, "stop", None),
        ({"ignore_eos": True, "max_tokens": 4}, [EOS, EOS, 5, EOS, 6], 4, "length", None),
        ({"stop_token_ids": [9]}, [5, 9, 6], 2, "stop", 9),
        ({"stop_token_ids": [9], "min_tokens": 2}, [9, 9, 9, 5], 3, "stop", 9),
        ({"max_tokens": 3}, [5, 6, 7, 8], 3, "length", None),
    ],
)
def test_stop_conditions(
    params: dict[str, object],
    tokens: list[int],
    expected_len: int,
    reason: str,
    stop_reason: int | None,
) -> None:
    sched = make_scheduler()
    sched.add_request(make_request("r", 4, **params))
    outputs = run_until_done(sched, tokens)
    generated = [t for o in outputs for t in o.new_token_ids]
    assert generated == tokens[:expected_len]
    assert [o.finish_reason for o in outputs[:-1]] == [None] * (expected_len - 1)
    assert outputs[-1].finish_reason == reason
    assert outputs[-1].stop_reason == stop_reason


def test_context_length_stops_with_length() -> None:
    sched = make_scheduler(max_model_len=20)
    sched.add_request(make_request("r", 16, max_tokens=None))
    outputs = run_until_done(sched, [5] * 10)
    assert len(outputs) == 4  # 16 + 4 == 20
    assert outputs[-1].finish_reason == "length"


def test_context_length_is_capped_by_the_cache_size() -> None:
    sched = make_scheduler(num_blocks=3, max_model_len=256)
    assert sched.max_model_len == 12
    with pytest.raises(ValueError, match="at most 11"):
        sched.add_request(make_request("r", 12))
    sched.add_request(make_request("r", 10, max_tokens=None))
    outputs = run_until_done(sched, [5] * 10)
    assert len(outputs) == 2
    assert outputs[-1].finish_reason == "length"


def test_logprobs_only_when_asked() -> None:
    from modelyard.engine.messages import TokenLogprobs

    sched = make_scheduler()
    sched.add_request(make_request("with", 3, logprobs=1))
    sched.add_request(make_request("without", 3))
    out = sched.schedule()
    lp = TokenLogprobs(token_id=7, logprob=-0.5, top_token_ids=[7], top_logprobs=[-0.5])
    runner = sample(out)
    runner.logprobs = {"with": lp, "without": lp}
    outs = {o.request_id: o for o in sched.update(out, runner)}
    assert outs["with"].new_logprobs == [lp]
    assert outs["without"].new_logprobs is None


# ---------------------------------------------------------------- validation and stats


def test_add_request_validation() -> None:
    sched = make_scheduler(max_model_len=16)
    with pytest.raises(ValueError, match="at most 15"):
        sched.add_request(make_request("long", 16))
    with pytest.raises(ValueError, match="empty"):
        sched.add_request(make_request("empty", []))
    sched.add_request(make_request("ok", 15))
    with pytest.raises(ValueError, match="already"):
        sched.add_request(make_request("ok", 3))
    with pytest.raises(ValueError, match="temperature"):
        sched.add_request(make_request("bad", 3, temperature=-1.0))
    assert list(sched.requests) == ["ok"]


def test_update_rejects_a_runner_that_skipped_a_sample() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("a", 3))
    out = sched.schedule()
    with pytest.raises(RuntimeError, match="'a'"):
        sched.update(out, RunnerOutput())
    assert sched.requests["a"].output_token_ids == []


def test_stats_snapshot() -> None:
    sched = make_scheduler(num_blocks=10, max_num_seqs=1)
    sched.add_request(make_request("a", 9))
    sched.add_request(make_request("b", 3))
    step(sched)
    stats = sched.stats()
    assert (stats.num_running, stats.num_waiting) == (1, 1)
    assert (stats.num_blocks, stats.num_free_blocks) == (10, 7)
    assert stats.kv_cache_usage == pytest.approx(0.3)
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (9, 0)
    assert stats.num_preemptions == 0
