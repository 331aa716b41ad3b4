import asyncio
from collections.abc import AsyncIterator

import pytest
from tiny_tokenizer import build_tokenizer

from fakes.engine import FakeCore, ThreadWorker, start_fake_client
from modelyard.engine.client.async_llm import AsyncLLM
from modelyard.engine.client.protocol import (
    EngineDeadError,
    EngineOverloadedError,
    PromptTooLongError,
    RequestOutput,
)
from modelyard.engine.config import AdmissionConfig
from modelyard.engine.messages import FinishReason
from modelyard.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit


async def make_llm(core: FakeCore, **limits: int) -> tuple[AsyncLLM, ThreadWorker]:
    client, worker = await start_fake_client(core)
    admission = AdmissionConfig(**limits)
    llm = AsyncLLM(client, build_tokenizer(), model_name="fake", admission=admission)
    return llm, worker


async def collect(stream: AsyncIterator[RequestOutput]) -> list[RequestOutput]:
    return [out async for out in stream]


async def wait_for(predicate: object, within_s: float = 2.0) -> None:
    for _ in range(int(within_s / 0.01)):
        if predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_stream_text_tokens_and_metrics() -> None:
    core = FakeCore()
    llm, _ = await make_llm(core)
    tok = build_tokenizer()
    try:
        outs = await collect(llm.generate("Hello world", SamplingParams(max_tokens=5), "r1"))
        assert outs[-1].finished
        assert not any(o.finished for o in outs[:-1])
        ids = [t for o in outs for d in o.deltas for t in d.token_ids]
        prompt = tok.encode("Hello world")
        assert ids == (prompt * 5)[:5]  # the fake engine echoes the prompt
        assert "".join(d.text for o in outs for d in o.deltas) == tok.decode(ids)
        assert outs[-1].deltas[-1].finish_reason is FinishReason.LENGTH
        assert outs[-1].num_generated_tokens == 5
        assert outs[-1].num_prompt_tokens == len(prompt)
        m = outs[-1].metrics
        assert m.first_scheduled_time is not None
        assert m.first_token_time is not None
        assert m.finished_time is not None
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time
        assert core.added[0].prompt_token_ids == prompt
    finally:
        await llm.shutdown()


async def test_n_fan_out_shares_prompt_and_offsets_seeds() -> None:
    core = FakeCore()
    llm, _ = await make_llm(core)
    try:
        params = SamplingParams(n=3, seed=10, max_tokens=4, temperature=0.8)
        outs = await collect(llm.generate([5, 6, 7], params, "fan"))
        assert [r.request_id for r in core.added] == ["fan-0", "fan-1", "fan-2"]
        assert [r.sampling_params.seed for r in core.added] == [10, 11, 12]
        assert all(r.sampling_params.n == 1 for r in core.added)
        assert all(r.prompt_token_ids == [5, 6, 7] for r in core.added)
        for index in range(3):
            ids = [t for o in outs for d in o.deltas if d.index == index for t in d.token_ids]
            assert ids == [5, 6, 7, 5]
        finishes = [d for o in outs for d in o.deltas if d.finish_reason is not None]
        assert sorted(d.index for d in finishes) == [0, 1, 2]
        assert outs[-1].finished
        assert outs[-1].num_generated_tokens == 12
    finally:
        await llm.shutdown()


async def test_stop_string_trims_text_and_aborts_engine_request() -> None:
    tok = build_tokenizer()
    core = FakeCore(step_delay_s=0.005, script={"s": tok.encode("Hello STOP world and much more")})
    llm, _ = await make_llm(core)
    try:
        params = SamplingParams(stop=["STOP"], max_tokens=40)
        outs = await collect(llm.generate("Hi", params, "s"))
        text = "".join(d.text for o in outs for d in o.deltas)
        assert text == "Hello "
        last = outs[-1].deltas[-1]
        assert last.finish_reason is FinishReason.STOP
        assert last.stop_reason == "STOP"
        await wait_for(lambda: "s" in core.aborted)
    finally:
        await llm.shutdown()


async def test_a_stop_string_inside_a_multi_token_output_keeps_the_tokens_up_to_it() -> None:
    tok = build_tokenizer()
    script = tok.encode("one two three four five six seven")
    core = FakeCore(tokens_per_step=4, script={"s": script})
    llm, _ = await make_llm(core)
    try:
        outs = await collect(llm.generate("Hi", SamplingParams(stop=["three"], max_tokens=40), "s"))
        ids = [t for o in outs for d in o.deltas for t in d.token_ids]
        upto = next(i for i in range(1, len(script) + 1) if "three" in tok.decode(script[:i]))
        assert ids == script[:upto]
        assert upto % 4 != 0  # the stop string ends inside a step's output
        assert "".join(d.text for o in outs for d in o.deltas) == "one two "
        assert outs[-1].num_generated_tokens == upto
    finally:
        await llm.shutdown()


async def test_early_close_aborts_in_engine() -> None:
    core = FakeCore(step_delay_s=0.01)
    llm, _ = await make_llm(core)
    try:
        stream = llm.generate("Hello", SamplingParams(max_tokens=50), "early")
        first = await stream.__anext__()  # type: ignore[attr-defined]
        assert first.deltas
        await stream.aclose()  # type: ignore[attr-defined]
        await wait_for(lambda: "early" in core.aborted)
        assert llm.num_waiting() == 0
    finally:
        await llm.shutdown()


async def test_cancelled_consumer_aborts_in_engine() -> None:
    core = FakeCore(step_delay_s=0.01)
    llm, _ = await make_llm(core)
    try:
        task = asyncio.create_task(
            collect(llm.generate("Hello", SamplingParams(n=2, max_tokens=50), "c"))
        )
        await wait_for(lambda: core.added and core.requests)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_for(lambda: {"c-0", "c-1"} <= set(core.aborted))
    finally:
        await llm.shutdown()


async def test_bounded_waiting_queue_rejects_with_retry_after() -> None:
    core = FakeCore(capacity=0)  # the engine never schedules anything: everything waits
    llm, _ = await make_llm(core, max_waiting_requests=2)
    try:
        streams = [llm.generate("Hello", SamplingParams(), f"w{i}") for i in range(2)]
        tasks = [asyncio.create_task(collect(s)) for s in streams]
        await wait_for(lambda: llm.num_waiting() == 2)
        with pytest.raises(EngineOverloadedError) as info:
            await collect(llm.generate("Hello", SamplingParams(), "w2"))
        assert info.value.retry_after_s > 0
        await llm.abort("w0")
        outs = await tasks[0]
        assert outs[-1].deltas[-1].finish_reason is FinishReason.ABORT
        assert llm.num_waiting() == 1
        tasks.append(asyncio.create_task(collect(llm.generate("Hi", SamplingParams(), "w3"))))
        await wait_for(lambda: llm.num_waiting() == 2)  # a freed slot admits the next one
    finally:
        await llm.shutdown()
    for task in tasks[1:]:
        with pytest.raises(EngineDeadError, match="shut down"):
            await task


async def test_prompt_token_budget_counts_waiting_tokens() -> None:
    core = FakeCore(capacity=0)
    llm, _ = await make_llm(core, max_waiting_prompt_tokens=10)
    try:
        task = asyncio.create_task(collect(llm.generate(list(range(1, 9)), SamplingParams(), "a")))
        await wait_for(lambda: llm.num_waiting() == 1)
        with pytest.raises(EngineOverloadedError, match="prompt tokens"):
            await collect(llm.generate([1, 2, 3], SamplingParams(), "b"))
        await llm.abort("a")
        await task
    finally:
        await llm.shutdown()


async def test_invalid_input_is_rejected_before_the_engine() -> None:
    core = FakeCore()
    llm, _ = await make_llm(core)
    try:
        with pytest.raises(PromptTooLongError, match=r"60 tokens.*max_tokens is 10.*64"):
            await collect(llm.generate(list(range(1, 61)), SamplingParams(max_tokens=10), "x"))
        with pytest.raises(ValueError, match=r"^temperature"):
            await collect(llm.generate("Hi", SamplingParams(temperature=-1), "y"))
        with pytest.raises(ValueError, match="empty"):
            await collect(llm.generate([], SamplingParams(), "z"))
        assert core.added == []
        assert llm.num_waiting() == 0
    finally:
        await llm.shutdown()


async def test_dead_engine_raises_in_stream_and_on_new_requests() -> None:
    core = FakeCore(step_delay_s=0.01)
    llm, worker = await make_llm(core)
    stream = llm.generate("Hello", SamplingParams(max_tokens=60), "d")
    await stream.__anext__()  # type: ignore[attr-defined]
    worker.kill()
    with pytest.raises(EngineDeadError):
        await asyncio.wait_for(collect(stream), 2.0)
    assert not llm.is_alive
    with pytest.raises(EngineDeadError):
        await collect(llm.generate("Hello", SamplingParams(), "e"))
    await llm.shutdown()


async def test_chat_template_renders_with_generation_prompt() -> None:
    core = FakeCore()
    llm, _ = await make_llm(core)
    tok = build_tokenizer()
    try:
        ids = llm.apply_chat_template([{"role": "user", "content": "Hello"}])
        assert tok.decode(ids, skip_special_tokens=False) == (
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
        )
    finally:
        await llm.shutdown()


async def test_a_slow_consumer_gets_merged_outputs_with_every_token_and_the_text() -> None:
    core = FakeCore(step_delay_s=0.002)
    llm, _ = await make_llm(core)
    tok = build_tokenizer()
    try:
        params = SamplingParams(n=2, max_tokens=40, seed=1, temperature=0.5)
        outs: list[RequestOutput] = []
        async for out in llm.generate("Hello world, café 🙂", params, "slow"):
            outs.append(out)
            await asyncio.sleep(0.03)  # the engine runs ~15 steps meanwhile
        assert len(outs) < 40  # merged: fewer updates than tokens
        assert outs[-1].finished
        assert not any(o.finished for o in outs[:-1])
        for index in range(2):
            deltas = [d for o in outs for d in o.deltas if d.index == index]
            ids = [t for d in deltas for t in d.token_ids]
            assert ids == (tok.encode("Hello world, café 🙂") * 40)[:40]
            assert "".join(d.text for d in deltas) == tok.decode(ids)
            assert [d.finish_reason for d in deltas if d.finish_reason] == [FinishReason.LENGTH]
        assert outs[-1].num_generated_tokens == 80
    finally:
        await llm.shutdown()
