"""The offline `modelyard.LLM` (engine core in this process) on a tiny random Llama."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import hf_greedy

import modelyard
from modelyard.engine.llm import LLM
from modelyard.engine.messages import FinishReason
from modelyard.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.integration

PROMPTS = [
    "Hello",
    "The capital of France is",
    "Once upon a time there was a model server that streamed",
    "The capital of Japan",
]


@pytest.fixture(scope="module")
def llm(tiny_llama_dir: Path) -> LLM:
    return LLM(str(tiny_llama_dir), max_model_len=256, num_threads=1, num_blocks=64)


def test_public_lazy_export_is_this_class() -> None:
    assert modelyard.LLM is LLM


def test_greedy_batch_equals_transformers_in_input_order(llm: LLM, tiny_llama_dir: Path) -> None:
    results = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=10))
    assert [r.prompt for r in results] == PROMPTS
    for result in results:
        assert result.token_ids == hf_greedy(tiny_llama_dir, result.prompt_token_ids, 10)
        assert result.text == llm.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        assert result.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
    assert llm.stats().num_running == 0


def test_stop_string_and_n(llm: LLM) -> None:
    full = llm.generate(PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    text = full[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, stop=[stop], n=2)
    [result] = llm.generate(PROMPTS[1], params)
    assert len(result.completions) == 2
    for completion in result.completions:
        assert completion.text == text[: text.index(stop)]
        assert completion.finish_reason is FinishReason.STOP
        assert completion.stop_reason == stop
    assert llm.stats().num_running == 0


def test_chat_and_bad_options(llm: LLM, tiny_llama_dir: Path) -> None:
    [result] = llm.chat([{"role": "user", "content": "Hello"}], SamplingParams(max_tokens=4))
    assert llm.tokenizer.decode(result.prompt_token_ids, skip_special_tokens=False).endswith(
        "<|im_start|>assistant\n"
    )
    assert 1 <= len(result.token_ids) <= 4
    with pytest.raises(ValueError, match=r"engine options: unknown key.*no_such_option"):
        LLM(str(tiny_llama_dir), no_such_option=1)
