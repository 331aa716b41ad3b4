"""Issue 2 acceptance for sampling through the whole engine on a tiny random Llama: seeded
sampling is reproducible whatever the batch mates (chunked prefill and preemption included),
stop strings end and trim a completion, n > 1 shares the prompt's blocks."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import msgspec
import pytest
from acceptance_helpers import (
    BlockLimit,
    HFReference,
    make_core,
    random_corpus,
    run_core,
    tiny_model,
)

from modelyard.engine.llm import LLM
from modelyard.engine.messages import FinishReason
from modelyard.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.integration

T = TypeVar("T")
SEEDED = SamplingParams(temperature=1.0, seed=1234, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Path:
    return tiny_model("llama", tmp_path_factory.mktemp("acceptance"), tiny_llama_dir)


@pytest.fixture(scope="module")
def llm(folder: Path) -> LLM:
    return LLM(str(folder), max_model_len=512, num_threads=1, num_blocks=128)


@pytest.fixture(scope="module")
def corpus(llm: LLM) -> list[int]:
    return random_corpus(llm.runner.resolved.config.vocab_size, length=600, seed=1)


def test_seed_gives_same_text_alone_and_in_a_batch(llm: LLM, corpus: list[int]) -> None:
    prompt = corpus[:30]
    [alone] = llm.generate([prompt], SEEDED)
    mates = [corpus[100:105], prompt, corpus[200:290], corpus[50:70]]
    in_batch = llm.generate(mates, SEEDED)
    assert in_batch[1].text == alone.text
    assert in_batch[1].token_ids == alone.token_ids
    assert len(alone.token_ids) == 16
    others = {tuple(r.token_ids) for i, r in enumerate(in_batch) if i != 1}
    assert len(others) == 3  # batch mates with the same seed still got their own tokens


def test_seed_is_kept_through_chunked_prefill_and_preemption(llm: LLM, corpus: list[int]) -> None:
    prompt = corpus[:30]
    alone = run_core(make_core(llm.runner), {"alone": prompt}, SEEDED).tokens["alone"]
    mates = {"m0": corpus[300:346], "m1": corpus[150:195], "seeded": prompt, "m2": corpus[60:95]}
    params = {rid: SamplingParams(temperature=1.0, max_tokens=16) for rid in mates}
    params["m2"] = SamplingParams(temperature=0.7, seed=99, max_tokens=16)
    params["seeded"] = SEEDED
    # fresh request ids per run: each core here shares one runner, whose per-request state
    # the previous core's last finished ids never reached
    core = make_core(llm.runner, max_num_batched_tokens=24)
    chunked = run_core(core, _tagged("c", mates), _tagged("c", params))
    assert chunked.tokens["c-seeded"] == alone
    blocks = sum(-(-len(p) // 16) for p in mates.values())
    core = make_core(BlockLimit(llm.runner, blocks))
    preempted = run_core(core, _tagged("p", mates), _tagged("p", params))
    assert preempted.stats is not None
    assert preempted.stats.num_preemptions > 0
    assert preempted.tokens["p-seeded"] == alone
    assert preempted.tokens["p-m2"] == chunked.tokens["c-m2"]


def test_different_seeds_differ(llm: LLM, corpus: list[int]) -> None:
    prompt = corpus[:30]
    texts = [
        llm.generate([prompt], SamplingParams(temperature=1.0, seed=s, max_tokens=16))[0].text
        for s in (1, 2, 3, 4)
    ]
    assert len(set(texts)) > 1


def test_stop_strings_trim_and_finish(llm: LLM, corpus: list[int]) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [corpus[:40], corpus[100:140], corpus[250:262]]
    full = [r.text for r in llm.generate(prompts, greedy)]
    stop = _substring_only_in(full[0], full[1:])
    plus = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=["@@none@@", stop])
    results = llm.generate(prompts, plus)
    assert results[0].text == full[0][: full[0].index(stop)]
    assert results[0].finish_reason is FinishReason.STOP
    assert results[0].completions[0].stop_reason == stop
    assert len(results[0].token_ids) < 24
    for result, text in zip(results[1:], full[1:], strict=True):  # mates run to max_tokens
        assert result.text == text
        assert result.finish_reason is FinishReason.LENGTH
        assert len(result.token_ids) == 24
    stats = llm.stats()
    assert stats.num_running == 0
    assert stats.num_free_blocks == stats.num_blocks
    kept = msgspec.structs.replace(plus, include_stop_str_in_output=True)
    [with_stop] = llm.generate(prompts[:1], kept)
    assert with_stop.text == full[0][: full[0].index(stop) + len(stop)]


def test_n_completions_share_the_prompt_blocks(llm: LLM, folder: Path, corpus: list[int]) -> None:
    prompt = corpus[400:450]  # not seen by this engine before
    before = llm.stats().prefix_cache_hits
    [result] = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12, n=3))
    hits = llm.stats().prefix_cache_hits - before
    assert hits >= 2 * (len(prompt) // 16) * 16  # completions 2 and 3 reuse the full blocks
    [single] = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=12))
    assert len(result.completions) == 3
    assert single.token_ids == HFReference(folder).greedy(prompt, 12)
    for completion in result.completions:
        assert completion.token_ids == single.token_ids
        assert completion.text == single.text
        assert completion.finish_reason is single.finish_reason


def test_seeded_n_completions_are_reproducible(llm: LLM, corpus: list[int]) -> None:
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=12, n=3, ignore_eos=True)
    first = llm.generate([corpus[:30]], params)[0].completions
    again = llm.generate([corpus[5:9], corpus[:30]], params)[1].completions
    assert [c.token_ids for c in again] == [c.token_ids for c in first]
    assert len({tuple(c.token_ids) for c in first}) > 1  # seed + i per completion


def _substring_only_in(text: str, others: list[str]) -> str:
    """A 3-character substring from the middle of `text` found in none of `others`."""
    for start in range(len(text) // 3, 2 * len(text) // 3):
        candidate = text[start : start + 3]
        if candidate.strip() and not any(candidate in o for o in others):
            return candidate
    raise AssertionError(f"no usable stop string in {text!r}")


def _tagged(tag: str, items: dict[str, T]) -> dict[str, T]:
    return {f"{tag}-{key}": value for key, value in items.items()}
