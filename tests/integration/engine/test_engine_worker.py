"""AsyncLLM over a real engine worker process, on a tiny random Llama."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
import pytest_asyncio
from engine_helpers import engine_config, hf_greedy

from modelyard.engine.client.async_llm import AsyncLLM
from modelyard.engine.client.core_client import EngineCoreClient
from modelyard.engine.client.protocol import EngineDeadError, RequestOutput
from modelyard.engine.messages import FinishReason
from modelyard.engine.sampling_params import SamplingParams

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

PROMPTS = [
    "The capital of France is",
    "Once upon a time there was a model server that",
    "Hello",
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def llm(tiny_llama_dir: Path) -> AsyncIterator[AsyncLLM]:
    engine = await AsyncLLM.start(engine_config(tiny_llama_dir), model_name="tiny")
    yield engine
    await engine.shutdown()


async def collect(stream: AsyncIterator[RequestOutput]) -> list[RequestOutput]:
    return [out async for out in stream]


def joined(outs: list[RequestOutput], index: int = 0) -> tuple[str, list[int]]:
    deltas = [d for o in outs for d in o.deltas if d.index == index]
    return "".join(d.text for d in deltas), [t for d in deltas for t in d.token_ids]


async def wait_until(predicate: object, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def test_ready_reports_the_model(llm: AsyncLLM, tiny_llama_dir: Path) -> None:
    assert llm.is_alive
    assert llm.ready.num_blocks == 64
    assert llm.ready.rss_bytes > 0
    assert llm.max_model_len == 256


async def test_concurrent_greedy_streams_equal_transformers(
    llm: AsyncLLM, tiny_llama_dir: Path
) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=12)
    ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    outs = await asyncio.gather(
        *(collect(llm.generate(p, params, f"greedy-{i}")) for i, p in enumerate(PROMPTS))
    )
    for prompt_ids, out in zip(ids, outs, strict=True):
        text, tokens = joined(out)
        assert tokens == hf_greedy(tiny_llama_dir, prompt_ids, 12)
        assert text == llm.tokenizer.decode(tokens, skip_special_tokens=True)
        assert out[-1].finished
        assert out[-1].metrics.first_token_time is not None


async def test_stop_string_trims_real_output(llm: AsyncLLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    full, _ = joined(await collect(llm.generate(PROMPTS[0], params, "full")))
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip(), f"pick another prompt: {full!r}"
    stopped = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop=[stop])
    outs = await collect(llm.generate(PROMPTS[0], stopped, "stopped"))
    text, _ = joined(outs)
    assert text == full[: full.index(stop)]
    assert outs[-1].deltas[-1].finish_reason is FinishReason.STOP
    assert outs[-1].deltas[-1].stop_reason == stop


async def test_seeded_n_is_reproducible(llm: AsyncLLM) -> None:
    params = SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True)
    first = await collect(llm.generate(PROMPTS[1], params, "seed-a"))
    second = await collect(llm.generate(PROMPTS[1], params, "seed-b"))
    for index in (0, 1):
        assert joined(first, index)[1] == joined(second, index)[1]
        assert len(joined(first, index)[1]) == 8


async def test_abort_on_close_frees_blocks(llm: AsyncLLM) -> None:
    await wait_until(lambda: llm.stats().num_running == 0, 2.0)
    before = llm.stats()
    prompt = llm.tokenizer.encode(" ".join(PROMPTS * 3))
    # the whole context, EOS ignored: it cannot finish before the abort, 3 steps in
    params = SamplingParams(
        temperature=0.0, max_tokens=llm.max_model_len - len(prompt), ignore_eos=True
    )
    stream = llm.generate(prompt, params, "abort-me")
    outputs = []
    async for out in stream:  # type: ignore[attr-defined]
        outputs.append(out)
        if out.num_generated_tokens >= 3:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    await wait_until(lambda: llm.stats().num_aborted == before.num_aborted + 1, 2.0)
    await wait_until(lambda: llm.stats().num_free_blocks == llm.ready.num_blocks, 2.0)
    assert not any(out.finished for out in outputs)  # no finish reason reached the caller
    assert llm.stats().num_running == 0


async def test_kill_9_fails_every_caller_within_2s_and_a_new_engine_starts(
    tiny_llama_dir: Path,
) -> None:
    victim = await AsyncLLM.start(engine_config(tiny_llama_dir), model_name="victim")
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    streams = [victim.generate(p, params, f"k{i}") for i, p in enumerate(PROMPTS)]
    for stream in streams:
        await stream.__anext__()  # type: ignore[attr-defined]
    pid = victim.engine_client.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    for stream in streams:
        with pytest.raises(EngineDeadError):
            await asyncio.wait_for(collect(stream), 2.0)
    assert time.monotonic() - killed_at < 2.0
    assert not victim.is_alive
    await victim.shutdown()

    # a new engine starts cleanly, serves, and a clean shutdown leaves nothing behind
    fresh = await AsyncLLM.start(engine_config(tiny_llama_dir), model_name="fresh")
    outs = await collect(fresh.generate(PROMPTS[2], SamplingParams(max_tokens=3), "again"))
    assert outs[-1].finished
    client = fresh.engine_client
    pid = client.pid
    sockets = client.worker.conn.addresses  # type: ignore[attr-defined]
    await fresh.shutdown()
    await fresh.shutdown()  # idempotent
    assert client.worker.exitcode == 0
    assert pid is not None
    assert not psutil.pid_exists(pid)
    assert not Path(sockets.to_worker.removeprefix("ipc://")).exists()  # noqa: ASYNC240


async def test_start_failure_reports_the_worker_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="not found"):
        await EngineCoreClient.start(engine_config(tmp_path / "missing"), ready_timeout_s=60)
