"""Issue 2 acceptance on a tiny random Llama through the whole engine (scheduler + KV cache +
native paged runner, in this process): greedy tokens equal transformers `generate` in a batch
of 1 and of 32 mixed-length prompts, with prefix caching, chunked prefill and forced
preemption; abort frees the request's blocks."""

from __future__ import annotations

from pathlib import Path

import pytest
from acceptance_helpers import (
    BATCH_LENGTHS,
    HFReference,
    check_batch,
    check_chunked_prefill,
    check_preemption,
    check_prefix_caching,
    load_runner,
    make_core,
    mixed_prompts,
    random_corpus,
    run_core,
    shared_prefix_prompts,
    tiny_model,
)

from modelyard.engine.core.engine_core import EngineCore
from modelyard.engine.messages import EngineRequest
from modelyard.engine.sampling_params import SamplingParams
from modelyard.runner.model_runner import ModelRunner

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Path:
    return tiny_model("llama", tmp_path_factory.mktemp("acceptance"), tiny_llama_dir)


@pytest.fixture(scope="module")
def runner(folder: Path) -> ModelRunner:
    runner = load_runner(folder)
    assert runner.implementation == "native"
    return runner


@pytest.fixture(scope="module")
def ref(folder: Path) -> HFReference:
    return HFReference(folder)


@pytest.fixture(scope="module")
def corpus(runner: ModelRunner) -> list[int]:
    return random_corpus(runner.resolved.config.vocab_size)


def test_batch_of_one(runner: ModelRunner, ref: HFReference, corpus: list[int]) -> None:
    run = check_batch(runner, ref, {"one": corpus[:37]})
    assert len(set(run.tokens["one"])) >= 3  # a reference that depends on the context


def test_batch_of_32_mixed_lengths(
    runner: ModelRunner, ref: HFReference, corpus: list[int]
) -> None:
    prompts = mixed_prompts(corpus, BATCH_LENGTHS, "mixed")
    run = check_batch(runner, ref, prompts)
    assert len({tuple(t) for t in run.tokens.values()}) > len(prompts) // 2


def test_prefix_caching(runner: ModelRunner, ref: HFReference, corpus: list[int]) -> None:
    suffixes = [corpus[300 + 9 * i : 300 + 9 * i + 3 + i] for i in range(8)]
    check_prefix_caching(runner, ref, shared_prefix_prompts(corpus[:100], suffixes))


def test_chunked_prefill(runner: ModelRunner, ref: HFReference, corpus: list[int]) -> None:
    check_chunked_prefill(runner, ref, corpus[50:350], corpus[10:30])


def test_forced_preemption(runner: ModelRunner, ref: HFReference, corpus: list[int]) -> None:
    check_preemption(runner, ref, mixed_prompts(corpus, [40, 44, 48, 53, 58], "mixed"))


def _add(core: EngineCore, request_id: str, prompt: list[int]) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    core.add_request(
        EngineRequest(request_id=request_id, prompt_token_ids=prompt, sampling_params=params)
    )


def test_abort_running_request_frees_its_blocks(runner: ModelRunner, corpus: list[int]) -> None:
    core = make_core(runner)
    baseline = core.stats().num_free_blocks
    _add(core, "a", corpus[:100])
    _add(core, "b", corpus[200:220])
    assert [o.request_id for o in core.step() + core.step()] == ["a", "b", "a", "b"]
    assert core.stats().num_free_blocks < baseline - 7  # "a" alone holds 7 blocks
    core.abort_requests(["a"])
    assert [o.request_id for o in core.step()] == ["b"]  # "a" is gone, "b" goes on
    held_by_b = len(core.scheduler.requests["b"].block_ids)
    assert core.stats().num_free_blocks == baseline - held_by_b
    core.abort_requests(["b"])
    assert core.step() == []
    assert core.stats().num_free_blocks == baseline
    assert not core.has_unfinished_requests()


def test_abort_mid_chunked_prefill_frees_its_blocks(
    runner: ModelRunner, ref: HFReference, corpus: list[int]
) -> None:
    core = make_core(runner, max_num_batched_tokens=32)
    baseline = core.stats().num_free_blocks
    _add(core, "a", corpus[:100])
    assert core.step() == []  # the first 32-token chunk: nothing sampled yet
    assert core.stats().num_free_blocks == baseline - 2
    core.abort_requests(["a"])
    assert core.step() == []
    assert core.stats().num_free_blocks == baseline
    # the engine goes on normally, and the aborted chunk left no wrong KV in the prefix cache
    prompt = corpus[:100]
    run = run_core(core, {"again": prompt})
    assert run.tokens["again"] == ref.greedy(prompt)
