"""EngineCore end to end with a fake runner that models the paged KV cache.

The fake runner stores, in place of K/V tensors, the token id written at each KV slot, and at
every step checks that all positions before `start_position` hold the request's own tokens.
A wrong block table, a bad prefix-cache hit, a block shared while still being written, or a
preempted request resuming from the wrong place shows up as a mismatch. It samples a token that
depends only on (request id, position), so the expected outputs are known without the engine.
"""

import zlib
from dataclasses import dataclass, field

import pytest

from modelyard.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from modelyard.engine.core.engine_core import EngineCore
from modelyard.engine.core.scheduler_output import RunnerOutput, ScheduledRequest, SchedulerOutput
from modelyard.engine.messages import EngineRequest
from modelyard.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit

BS = 4


def next_token(request_id: str, position: int) -> int:
    """The token the fake model samples at `position` (never 0..99, so never EOS=2)."""
    return 100 + zlib.crc32(f"{request_id}:{position}".encode()) % 5000


class KVMismatch(BaseException):
    """The fake found a wrong KV or batch (a BaseException: the core must not isolate it)."""


def check(ok: bool, message: str) -> None:
    if not ok:
        raise KVMismatch(message)


@dataclass
class FakeKVRunner:
    num_kv_blocks: int
    max_model_len: int = 512
    eos_token_ids: list[int] = field(default_factory=lambda: [2])
    vocab_size: int = 10_000
    slots: list[int | None] = field(init=False)
    finished_seen: list[str] = field(default_factory=list)
    num_steps: int = 0
    fail_next: bool = False  # raise on the next execute, writing nothing
    poison: set[int] = field(default_factory=set)  # a step holding one: garbage KV, then raise
    always_fail: bool = False  # every step raises (a runner bug, not a request)

    def __post_init__(self) -> None:
        self.slots = [None] * (self.num_kv_blocks * BS)

    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        self.num_steps += 1
        self.finished_seen += scheduler_output.finished_request_ids
        scheduled = scheduler_output.scheduled
        check(
            scheduler_output.num_batched_tokens == sum(len(s.token_ids) for s in scheduled),
            "num_batched_tokens",
        )
        if self.fail_next or self.always_fail:
            self.fail_next = False
            raise RuntimeError("simulated runner failure")
        poisoned = any(not self.poison.isdisjoint(s.token_ids) for s in scheduled)
        # Like the real forward: every new K/V of the step is written before attention reads
        # (a poisoned step writes garbage for all its members, then fails).
        for s in scheduled:
            end = s.start_position + len(s.token_ids)
            for position, token in zip(range(s.start_position, end), s.token_ids, strict=True):
                self.slots[self._slot(s.block_table, position)] = -1 if poisoned else token
        if poisoned:
            raise RuntimeError("poisoned step")
        return RunnerOutput(sampled_token_ids=self._sample(scheduled))

    def _sample(self, scheduled: list[ScheduledRequest]) -> dict[str, int]:
        sampled = {}
        for s in scheduled:
            tokens = [*s.prompt_token_ids, *s.output_token_ids]
            end = s.start_position + len(s.token_ids)
            check(list(s.token_ids) == tokens[s.start_position : end], "scheduled tokens")
            for position in range(end):
                check(
                    self.slots[self._slot(s.block_table, position)] == tokens[position],
                    f"{s.request_id}: KV at position {position} is not its token",
                )
            if s.sample:
                sampled[s.request_id] = next_token(s.request_id, end)
        return sampled

    @staticmethod
    def _slot(block_table: object, position: int) -> int:
        assert isinstance(block_table, list)
        return int(block_table[position // BS]) * BS + position % BS


def make_core(
    runner: FakeKVRunner,
    *,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 64,
    prefix_caching: bool = True,
) -> EngineCore:
    config = EngineConfig(
        model=ModelConfig(model="fake"),
        cache=CacheConfig(block_size=BS, enable_prefix_caching=prefix_caching),
        scheduler=SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens
        ),
    )
    return EngineCore(config, runner)


def make_request(
    request_id: str, prompt: list[int], max_tokens: int, priority: int = 0, arrival: float = 0.0
) -> EngineRequest:
    return EngineRequest(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=max_tokens),
        priority=priority,
        arrival_time=arrival,
    )


def workload() -> list[tuple[int, EngineRequest]]:
    """(step at which it arrives, request): a shared system prompt, mixed lengths, priorities."""
    system = list(range(500, 510))
    arrivals = []
    for i in range(12):
        prompt = [*system, *range(1000 + 50 * i, 1000 + 50 * i + 1 + (7 * i) % 20)]
        if i % 4 == 3:
            prompt = list(range(2000 + 50 * i, 2000 + 50 * i + 3 + i))  # no shared prefix
        request = make_request(f"r{i}", prompt, max_tokens=3 + (5 * i) % 10, priority=i % 3)
        arrivals.append(((i * 3) // 4, request))
    return arrivals


def drive(core: EngineCore, arrivals: list[tuple[int, EngineRequest]]) -> dict[str, list[int]]:
    """Run to completion; requests join at their step. Returns the tokens per request."""
    tokens: dict[str, list[int]] = {}
    pending = sorted(arrivals, key=lambda a: a[0])
    step_no = 0
    while pending or core.has_unfinished_requests():
        while pending and pending[0][0] <= step_no:
            request = pending.pop(0)[1]
            tokens[request.request_id] = []
            core.add_request(request)
        for output in core.step():
            assert output.request_id in tokens
            tokens[output.request_id] += output.new_token_ids
            assert output.finish_reason in (None, "length")
        step_no += 1
        assert step_no < 2000, "no progress"
    return tokens


def expected(arrivals: list[tuple[int, EngineRequest]]) -> dict[str, list[int]]:
    reference = {}
    for _, r in arrivals:
        num_prompt, max_tokens = len(r.prompt_token_ids), r.sampling_params.max_tokens
        assert max_tokens is not None
        reference[r.request_id] = [
            next_token(r.request_id, num_prompt + i) for i in range(max_tokens)
        ]
    return reference


@pytest.mark.parametrize(
    ("num_blocks", "core_kwargs", "min_preemptions"),
    [
        pytest.param(256, {}, 0, id="roomy"),
        pytest.param(256, {"prefix_caching": False}, 0, id="no-prefix-cache"),
        pytest.param(256, {"max_num_batched_tokens": 8}, 0, id="chunked-prefill"),
        pytest.param(256, {"max_num_seqs": 2}, 0, id="two-seqs"),
        pytest.param(12, {}, 1, id="tiny-kv-preemption"),
        pytest.param(12, {"max_num_batched_tokens": 8, "prefix_caching": False}, 1, id="tiny-all"),
    ],
)
def test_outputs_match_reference(
    num_blocks: int, core_kwargs: dict[str, object], min_preemptions: int
) -> None:
    runner = FakeKVRunner(num_kv_blocks=num_blocks)
    core = make_core(runner, **core_kwargs)  # type: ignore[arg-type]
    arrivals = workload()
    assert drive(core, arrivals) == expected(arrivals)
    stats = core.stats()
    assert stats.num_preemptions >= min_preemptions
    assert stats.num_free_blocks == num_blocks
    assert (stats.num_running, stats.num_waiting) == (0, 0)
    assert len(runner.finished_seen) == len(set(runner.finished_seen))
    if core_kwargs.get("prefix_caching", True):
        assert stats.prefix_cache_hits > 0
    else:
        assert stats.prefix_cache_hits == 0


def test_prefix_hits_are_counted_in_tokens() -> None:
    runner = FakeKVRunner(num_kv_blocks=64)
    core = make_core(runner)
    system = list(range(300, 312))  # three full blocks
    core.add_request(make_request("a", [*system, 1, 2], max_tokens=2))
    core.step()
    core.add_request(make_request("b", [*system, 3], max_tokens=2))
    outputs = {o.request_id: o for o in core.step()}
    assert outputs["b"].num_cached_tokens == 12
    stats = core.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (14 + 13, 12)


def test_step_is_empty_when_idle() -> None:
    core = make_core(FakeKVRunner(num_kv_blocks=8))
    assert core.step() == []
    assert not core.has_unfinished_requests()


def test_abort_frees_blocks_before_the_next_step() -> None:
    runner = FakeKVRunner(num_kv_blocks=32)
    core = make_core(runner)
    baseline = core.stats().num_free_blocks
    core.add_request(make_request("a", list(range(10, 30)), max_tokens=50))
    core.step()
    core.step()
    assert core.stats().num_free_blocks < baseline
    core.abort_requests(["a"])
    assert core.stats().num_free_blocks == baseline
    assert not core.has_unfinished_requests()
    core.add_request(make_request("b", [7, 8, 9], max_tokens=1))
    core.step()
    assert runner.finished_seen == ["a"]


def test_eos_from_the_runner_stops_the_request() -> None:
    prompt = [5, 6, 7]
    eos = next_token("r", len(prompt) + 2)  # the third generated token
    runner = FakeKVRunner(num_kv_blocks=8, eos_token_ids=[eos])
    core = make_core(runner)
    core.add_request(make_request("r", prompt, max_tokens=10))
    outputs = [o for _ in range(5) for o in core.step()]
    assert [t for o in outputs for t in o.new_token_ids] == [
        next_token("r", 3),
        next_token("r", 4),
        eos,
    ]
    assert outputs[-1].finish_reason == "stop"


def test_prompt_too_long_is_rejected() -> None:
    core = make_core(FakeKVRunner(num_kv_blocks=64, max_model_len=32))
    with pytest.raises(ValueError):
        core.add_request(make_request("long", list(range(32)), max_tokens=1))
    core.add_request(make_request("fits", list(range(31)), max_tokens=4))
    outputs = [o for _ in range(3) for o in core.step()]
    assert len(outputs) == 1
    assert outputs[0].finish_reason == "length"


def test_siblings_share_the_prompt_and_match_the_reference() -> None:
    runner = FakeKVRunner(num_kv_blocks=64)
    core = make_core(runner)
    prompt = list(range(700, 718))
    arrivals = [(0, make_request(f"n{i}", prompt, max_tokens=6)) for i in range(4)]
    assert drive(core, arrivals) == expected(arrivals)
    assert core.stats().prefix_cache_hits == 3 * 16


def test_failed_step_leaves_no_unwritten_blocks_in_the_prefix_cache() -> None:
    runner = FakeKVRunner(num_kv_blocks=16)
    core = make_core(runner)
    prompt = list(range(700, 718))
    core.add_request(make_request("a", prompt, max_tokens=4))
    runner.fail_next = True
    [failed] = core.step()  # alone in its batch: it is the one that made the step fail
    assert (failed.request_id, failed.finish_reason) == ("a", "error")
    assert "simulated runner failure" in str(failed.error)
    assert not core.has_unfinished_requests()
    assert core.stats().num_free_blocks == 16
    core.add_request(make_request("b", prompt, max_tokens=4))
    outputs = [o for _ in range(4) for o in core.step()]  # the fake checks the KV it reads
    assert outputs[0].num_cached_tokens == 0
    assert [t for o in outputs for t in o.new_token_ids] == expected(
        [(0, make_request("b", prompt, 4))]
    )["b"]


# ---------------------------------------------------------------- isolation of a failing step

POISON = 4242


def drive_with_failures(
    core: EngineCore, arrivals: list[tuple[int, EngineRequest]]
) -> tuple[dict[str, list[int]], dict[str, str]]:
    """Like drive(), also accepting ERROR outputs: (tokens per request, error per request)."""
    tokens: dict[str, list[int]] = {}
    errors: dict[str, str] = {}
    pending = sorted(arrivals, key=lambda a: a[0])
    step_no = 0
    while pending or core.has_unfinished_requests():
        while pending and pending[0][0] <= step_no:
            request = pending.pop(0)[1]
            tokens[request.request_id] = []
            core.add_request(request)
        for output in core.step():
            assert output.request_id not in errors, "output after the final one"
            tokens[output.request_id] += output.new_token_ids
            if output.finish_reason == "error":
                assert output.error is not None
                errors[output.request_id] = output.error
        step_no += 1
        assert step_no < 2000, "no progress"
    return tokens, errors


@pytest.mark.parametrize("num_blocks", [256, 14])
def test_a_poisoned_request_fails_alone_and_the_others_are_unchanged(num_blocks: int) -> None:
    runner = FakeKVRunner(num_kv_blocks=num_blocks, poison={POISON})
    core = make_core(runner)
    arrivals = workload()
    poisoned = make_request("poison", [*range(500, 510), 7, POISON, 8], max_tokens=5)
    tokens, errors = drive_with_failures(core, [*arrivals, (2, poisoned)])
    assert {k: v for k, v in tokens.items() if k != "poison"} == expected(arrivals)
    assert tokens["poison"] == []
    assert list(errors) == ["poison"]
    assert errors["poison"].startswith("this request failed in the engine: RuntimeError")
    stats = core.stats()
    assert stats.num_failed_requests == 1
    assert stats.num_free_blocks == num_blocks
    assert "poison" in runner.finished_seen  # the runner was told to drop its state


def test_a_request_reading_a_failed_requests_blocks_is_recomputed_not_failed() -> None:
    runner = FakeKVRunner(num_kv_blocks=64, poison={POISON})
    core = make_core(runner)
    shared = list(range(600, 608))  # two full blocks
    core.add_request(make_request("bad", [*shared, 9, POISON], max_tokens=3))
    core.add_request(make_request("mate", [*shared, 11, 12, 13], max_tokens=3))
    core.add_request(make_request("other", [20, 21, 22], max_tokens=3))
    first = core.step()  # "mate" shares the blocks "bad" was writing in this very step
    outcome = [(o.request_id, o.finish_reason) for o in first]
    assert outcome == [("bad", "error"), ("other", None)]
    assert core.stats().num_preemptions == 1  # "mate" went back to the queue
    rest = [o for _ in range(8) for o in core.step()]
    for request_id, prompt_len in (("mate", 11), ("other", 3)):
        produced = [t for o in first + rest if o.request_id == request_id for t in o.new_token_ids]
        assert produced == [next_token(request_id, prompt_len + i) for i in range(3)]
    assert core.stats().num_failed_requests == 1


def test_a_step_that_fails_for_every_request_fails_them_all() -> None:
    runner = FakeKVRunner(num_kv_blocks=64, always_fail=True)
    core = make_core(runner)
    for i in range(5):
        core.add_request(make_request(f"r{i}", [30 + i, 40 + i], max_tokens=3))
    outputs = core.step()
    assert sorted(o.request_id for o in outputs) == [f"r{i}" for i in range(5)]
    assert {o.finish_reason for o in outputs} == {"error"}
    assert not core.has_unfinished_requests()
    assert core.stats().num_free_blocks == 64
    assert runner.num_steps < 2 * 5 + 1  # bisection, not one run per subset


def test_a_token_id_outside_the_vocabulary_is_refused_before_it_runs() -> None:
    core = make_core(FakeKVRunner(num_kv_blocks=8, vocab_size=100))
    for bad in ([5, 100], [-1, 5]):
        with pytest.raises(ValueError, match="outside"):
            core.add_request(make_request("r", bad, max_tokens=1))
    assert not core.has_unfinished_requests()


def test_the_fault_drill_fails_the_step_holding_the_poison_token() -> None:
    from fault_drill import PoisonError, with_poison

    runner = FakeKVRunner(num_kv_blocks=64)
    assert with_poison(runner, ()) is runner
    core = make_core(with_poison(runner, [POISON]))  # type: ignore[arg-type]
    core.add_request(make_request("clean", [30, 31, 32], max_tokens=2))
    core.add_request(make_request("bad", [30, POISON], max_tokens=2))
    outputs = [o for _ in range(3) for o in core.step()]
    errors = {o.request_id: o.error for o in outputs if o.finish_reason == "error"}
    assert list(errors) == ["bad"]
    assert PoisonError.__name__ in str(errors["bad"])
    assert [t for o in outputs if o.request_id == "clean" for t in o.new_token_ids] == [
        next_token("clean", 3),
        next_token("clean", 4),
    ]


def test_the_fault_drill_keeps_the_rest_of_the_runner() -> None:
    from fault_drill import with_poison

    runner = FakeKVRunner(num_kv_blocks=8)
    poisoned = with_poison(runner, [POISON])
    assert poisoned is not runner
    assert poisoned.slots is runner.slots  # type: ignore[attr-defined]  # e.g. check_lora


def test_the_runners_structured_output_figures_reach_the_stats() -> None:
    from modelyard.engine.core.scheduler_output import StructuredOutputStats

    class StructuredRunner(FakeKVRunner):
        def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
            out = super().execute(scheduler_output)
            out.structured = StructuredOutputStats(2, 0.5, 0.25, self.num_steps)
            return out

    core = make_core(StructuredRunner(num_kv_blocks=8))
    assert core.stats().structured_requests == 0
    core.add_request(
        EngineRequest(
            request_id="a", prompt_token_ids=[5, 6], sampling_params=SamplingParams(max_tokens=3)
        )
    )
    core.step()
    core.step()
    stats = core.stats()
    assert (stats.structured_requests, stats.structured_mask_steps) == (2, 2)
    assert (stats.structured_compile_seconds, stats.structured_mask_seconds) == (0.5, 0.25)
