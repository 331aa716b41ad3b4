"""The output processor on hand-made engine outputs: fan-out, per-completion text, stop strings."""

from __future__ import annotations

import pytest
from tiny_tokenizer import build_tokenizer

from modelyard.engine.client.chat_template import render_chat
from modelyard.engine.client.output_processor import (
    RequestState,
    check_prompt_length,
    prompt_ids,
)
from modelyard.engine.client.protocol import PromptTooLongError
from modelyard.engine.messages import EngineOutput, FinishReason
from modelyard.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit


def test_fan_out_gives_n_requests_with_their_own_seeds() -> None:
    tok = build_tokenizer()
    ids = prompt_ids(tok, "Hello world")
    state = RequestState("r", ids, SamplingParams(n=3, seed=10, max_tokens=4), tok)
    requests = state.engine_requests(priority=2)
    assert [r.request_id for r in requests] == ["r-0", "r-1", "r-2"]
    assert [r.sampling_params.seed for r in requests] == [10, 11, 12]
    assert {r.sampling_params.n for r in requests} == {1}
    assert all(r.prompt_token_ids == ids and r.priority == 2 for r in requests)
    single = RequestState("s", ids, SamplingParams(), tok).engine_requests()
    assert [r.request_id for r in single] == ["s"]


def test_outputs_become_deltas_per_completion_and_a_stop_string_ends_one() -> None:
    tok = build_tokenizer()
    ids = prompt_ids(tok, "Hello")
    state = RequestState("r", ids, SamplingParams(n=2, stop=["Paris"]), tok)
    text = tok.encode(" The capital of France is Paris. The end.")
    first = state.process(
        [
            EngineOutput(request_id="r-0", new_token_ids=text),
            EngineOutput(request_id="r-1", new_token_ids=text[:2]),
        ]
    )
    assert first is not None
    assert not first.finished
    by_index = {d.index: d for d in first.deltas}
    assert by_index[0].text == " The capital of France is "
    assert by_index[0].finish_reason is FinishReason.STOP
    assert by_index[0].stop_reason == "Paris"
    upto = next(i for i in range(len(text) + 1) if "Paris" in tok.decode(text[:i]))
    assert by_index[0].token_ids == text[:upto]  # none after the stop string
    held_back = by_index[1].text  # the end may start a stop string: held back until known
    assert state.take_stopped() == ["r-0"]  # the engine still runs it: the caller aborts
    assert state.take_stopped() == []
    last = state.process(
        [EngineOutput(request_id="r-1", new_token_ids=[], finish_reason=FinishReason.LENGTH)]
    )
    assert last is not None
    assert last.finished
    assert held_back + last.deltas[0].text == tok.decode(text[:2])
    assert last.num_generated_tokens == upto + 2
    assert state.unfinished_ids() == []


def test_prompt_rules() -> None:
    tok = build_tokenizer()
    with pytest.raises(ValueError, match="empty"):
        prompt_ids(tok, [])
    assert prompt_ids(tok, (1, 2)) == [1, 2]
    with pytest.raises(PromptTooLongError):
        check_prompt_length(10, 7, 16)
    check_prompt_length(10, 6, 16)
    rendered = render_chat(tok, [{"role": "user", "content": "Hi"}])
    assert tok.decode(rendered).endswith("<|im_start|>assistant\n")
