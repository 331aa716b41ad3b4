"""Issue 2 acceptance for the generic transformers path inside the engine: tiny random GPT-2
and OPT (save_pretrained), a batch of mixed-length prompts and forced preemption, greedy
tokens equal to transformers `generate`."""

from __future__ import annotations

from pathlib import Path

import pytest
from acceptance_helpers import (
    HFReference,
    check_batch,
    check_preemption,
    load_runner,
    mixed_prompts,
    random_corpus,
    tiny_model,
)

from modelyard.runner.model_runner import ModelRunner

pytestmark = pytest.mark.integration

LENGTHS = [5, 9, 14, 22, 31, 47, 70, 101, 150]


@pytest.fixture(scope="module", params=["gpt2", "opt"])
def model(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path
) -> tuple[ModelRunner, HFReference, list[int]]:
    folder = tiny_model(request.param, tmp_path_factory.mktemp("acceptance"), tiny_llama_dir)
    runner = load_runner(folder)
    assert runner.implementation == "generic"
    return runner, HFReference(folder), random_corpus(runner.resolved.config.vocab_size)


def test_mixed_batch(model: tuple[ModelRunner, HFReference, list[int]]) -> None:
    runner, ref, corpus = model
    run = check_batch(runner, ref, mixed_prompts(corpus, LENGTHS, "mixed"))
    assert len({tuple(t) for t in run.tokens.values()}) > len(LENGTHS) // 2


def test_forced_preemption(model: tuple[ModelRunner, HFReference, list[int]]) -> None:
    runner, ref, corpus = model
    check_preemption(runner, ref, mixed_prompts(corpus, [40, 44, 47, 53], "preempt"))
