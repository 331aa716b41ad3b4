"""LoRA in the scheduler (no model): at most max_loras different adapters run at once (others
wait, in order), requests of one adapter share a slot, prefix-cache hashes are salted with the
adapter registration, and a model without LoRA refuses adapter requests."""

from __future__ import annotations

import pytest

from modelyard.engine.config import CacheConfig, SchedulerConfig
from modelyard.engine.core.scheduler import Scheduler
from modelyard.engine.core.scheduler_output import RunnerOutput
from modelyard.engine.messages import EngineRequest, LoRARequest
from modelyard.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit

BS = 4


def make_scheduler(max_loras: int = 2) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=256),
        CacheConfig(block_size=BS),
        num_blocks=64,
        max_model_len=256,
        eos_token_ids=[2],
        max_loras=max_loras,
    )


def lora(name: str, adapter_id: int = 1) -> LoRARequest:
    return LoRARequest(name=name, path=f"/adapters/{name}", adapter_id=adapter_id)


def request(
    rid: str, adapter: LoRARequest | None, prompt: list[int] | None = None
) -> EngineRequest:
    return EngineRequest(
        request_id=rid,
        prompt_token_ids=prompt or [10, 11, 12, 13, 14, 15, 16, 17, 18],
        sampling_params=SamplingParams(max_tokens=3),
        lora=adapter,
    )


def test_at_most_max_loras_adapters_run_at_once() -> None:
    sched = make_scheduler(max_loras=2)
    for rid, adapter in [
        ("a1", lora("a")),
        ("b1", lora("b")),
        ("a2", lora("a")),
        ("c1", lora("c")),
    ]:
        sched.add_request(request(rid, adapter))
    sched.add_request(request("base", None))
    out = sched.schedule()
    # c would be a third adapter: it waits, and (strict FCFS) so does the request behind it
    assert [s.request_id for s in out.scheduled] == ["a1", "b1", "a2"]
    assert [s.lora.name if s.lora else None for s in out.scheduled] == ["a", "b", "a"]
    while "a1" in sched.requests or "b1" in sched.requests or "a2" in sched.requests:
        assert "c1" not in {s.request_id for s in out.scheduled}
        sched.update(out, RunnerOutput(sampled_token_ids={s.request_id: 7 for s in out.scheduled}))
        out = sched.schedule()
    assert {s.request_id for s in out.scheduled} == {"c1", "base"}


def test_prefix_cache_hashes_are_salted_with_the_adapter_registration() -> None:
    sched = make_scheduler()
    prompt = list(range(20, 33))
    sched.add_request(request("a", lora("x", 1), prompt))
    out = sched.schedule()
    sched.update(out, RunnerOutput(sampled_token_ids={"a": 7}))
    hits = {}
    for rid, adapter in [("same", lora("x", 1)), ("other", lora("y", 2)), ("again", lora("x", 3))]:
        sched.add_request(request(rid, adapter, prompt))
        hits[rid] = sched.kv_cache.get_computed_blocks(sched.requests[rid])[1]
    sched.add_request(request("base", None, prompt))
    hits["base"] = sched.kv_cache.get_computed_blocks(sched.requests["base"])[1]
    assert hits == {"same": 12, "other": 0, "again": 0, "base": 0}


def test_a_model_without_lora_refuses_adapter_requests() -> None:
    sched = make_scheduler(max_loras=0)
    with pytest.raises(ValueError, match="no LoRA"):
        sched.add_request(request("a", lora("x")))
