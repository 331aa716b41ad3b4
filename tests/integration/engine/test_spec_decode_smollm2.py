"""Speculative decoding on the default model, SmolLM2-135M-Instruct (float32), through the whole
engine in this process: with prompt lookup and with the self-draft (its first layers and its
head), greedy requests that speculate give exactly the tokens of requests that do not, in one
batch that mixes both."""

from __future__ import annotations

import pytest
from acceptance_helpers import BLOCK_SIZE, run_core

from modelyard.engine.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from modelyard.engine.core import EngineCore
from modelyard.engine.sampling_params import SamplingParams
from modelyard.runner.loader import DEFAULT_MODEL
from modelyard.runner.model_runner import ModelRunner

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CODE = """def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax
"""
REQUESTS = [
    f"Rename the function total_price to order_total and repeat the whole code:\n{CODE}",
    "Copy this sentence exactly: The museum sells postcards, maps of the coastal path and "
    "small books about the history of navigation.",
]
CONFIGS = {
    "ngram": SpeculativeConfig(method="ngram", num_speculative_tokens=5),
    "self_draft": SpeculativeConfig(method="self_draft", num_speculative_tokens=3, draft_layers=10),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def runner(request: pytest.FixtureRequest) -> ModelRunner:
    return ModelRunner(
        ModelConfig(model=DEFAULT_MODEL, num_threads=1, max_model_len=1024),
        CacheConfig(block_size=BLOCK_SIZE, num_blocks=96),
        CONFIGS[request.param],
    )


def chat_ids(runner: ModelRunner, text: str) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(runner.tokenizer_path)
    messages = [{"role": "user", "content": text}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(rendered, add_special_tokens=False))


def test_greedy_tokens_equal_plain_decoding(runner: ModelRunner) -> None:
    assert runner.proposer is not None
    method = "ngram" if type(runner.proposer).__name__ == "NgramProposer" else "self_draft"
    config = EngineConfig(
        model=ModelConfig(model="preloaded"),
        cache=CacheConfig(block_size=BLOCK_SIZE),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=1024),
        speculative=CONFIGS[method],
    )
    prompts = {f"q{i}": chat_ids(runner, text) for i, text in enumerate(REQUESTS)}
    both = {**prompts, **{f"{rid}-plain": ids for rid, ids in prompts.items()}}
    params = {
        rid: SamplingParams(temperature=0.0, max_tokens=64, speculate=not rid.endswith("-plain"))
        for rid in both
    }
    run = run_core(EngineCore(config, runner), both, params)
    for rid in prompts:
        assert run.tokens[rid] == run.tokens[f"{rid}-plain"], rid
    assert run.stats is not None
    assert run.stats.spec_decode_method == method
    assert run.stats.spec_decode_num_accepted_tokens > 0
    assert run.stats.num_free_blocks == runner.num_kv_blocks
