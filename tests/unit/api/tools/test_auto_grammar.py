"""The auto-mode grammar of tool calls (api/tools/enforce.auto_calls) under llguidance's
matcher, over a byte-level tokenizer: free text is never constrained, calls are once started."""

from __future__ import annotations

import json
from typing import Any

import llguidance
import llguidance.hf
import llguidance.torch
import pytest

from grammar_helpers import EOS, VOCAB, byte_tokenizer
from modelyard.api.protocol import ChatCompletionRequest
from modelyard.api.tools.enforce import auto_calls
from modelyard.api.tools.parsing import ToolCalling, parser_for
from modelyard.engine import constraints
from modelyard.engine.client.chat_template import ToolFormat

pytestmark = pytest.mark.unit

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
SCHEMAS: dict[str, Any] = {"get_weather": WEATHER, "get_time": {"type": "object"}}
CALL = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris","days":2}}\n</tool_call>'
TIME = '<tool_call>\n{"name":"get_time","arguments":{"zone":"CET"}}\n</tool_call>'
FREE = 'Hello <b>world</b>, a <tool tag and {"json": 1}\n<tool_calls> no call here.'


@pytest.fixture(scope="module")
def tokenizer() -> llguidance.LLTokenizer:
    return byte_tokenizer()


def _matcher(tokenizer: llguidance.LLTokenizer, parallel: bool = True) -> llguidance.LLMatcher:
    grammar = constraints.grammar_text(auto_calls(SCHEMAS, parallel=parallel))
    return llguidance.LLMatcher(tokenizer, grammar)


def _consumes(matcher: llguidance.LLMatcher, text: str) -> bool:
    """Whether the whole text is accepted, then EOS."""
    ids = list(text.encode())
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


@pytest.mark.parametrize("parallel", [True, False])
def test_the_grammar_compiles(parallel: bool) -> None:
    constraints.check(auto_calls(SCHEMAS, parallel=parallel))


def test_free_text_is_never_masked(tokenizer: llguidance.LLTokenizer) -> None:
    """Every token that may begin a character (and EOS) stays allowed while the model writes
    text: greedy output without a call is the same as without the grammar."""
    matcher = _matcher(tokenizer)
    mask = llguidance.torch.allocate_token_bitmask(1, VOCAB)
    starts = [*range(128), *range(0xC2, 0xF5), EOS]  # not UTF-8 continuation bytes
    for byte in FREE.encode():
        llguidance.torch.fill_next_token_bitmask(matcher, mask, 0)
        words = mask[0].tolist()
        assert all((words[t // 32] >> (t % 32)) & 1 for t in starts)
        assert matcher.consume_token(byte)
    assert matcher.is_accepting()


@pytest.mark.parametrize(
    "text",
    [
        "",
        FREE,
        CALL,
        f"Let me check.\n{CALL}",
        f"{CALL}\n{TIME}",
    ],
)
def test_text_and_valid_calls_are_accepted(tokenizer: llguidance.LLTokenizer, text: str) -> None:
    assert _consumes(_matcher(tokenizer), text)
    if CALL in text:  # what the grammar lets through, the parser reads as calls
        calls = ToolCalling(parser_for(ToolFormat.HERMES)).message(text)["tool_calls"]
        assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "days": 2}


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name":"get_wind"',  # not a tool
        '<tool_call>\n{"name":"get_weather","arguments":{"city":3',  # not its schema
        '<tool_call>\n{"name":"get_weather","arguments":{"town"',  # no such field
        "<tool_call> {",  # not the block's layout
        f"{CALL} and then more text",  # after the calls: only calls
    ],
)
def test_a_malformed_call_is_rejected_once_it_starts(
    tokenizer: llguidance.LLTokenizer, text: str
) -> None:
    assert not _consumes(_matcher(tokenizer), text)


def test_parallel_calls_off_allows_one(tokenizer: llguidance.LLTokenizer) -> None:
    assert _consumes(_matcher(tokenizer, parallel=False), CALL)
    assert not _consumes(_matcher(tokenizer, parallel=False), f"{CALL}\n{CALL}")


def test_only_auto_requests_without_response_format_get_it() -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
    base = {"model": "m", "messages": [{"role": "user", "content": "w?"}], "tools": [tool]}
    offer = ChatCompletionRequest.model_validate(base).tool_offer()
    assert offer is not None
    assert offer.auto_constraint() == auto_calls({"get_weather": WEATHER}, parallel=True)
    forced = ChatCompletionRequest.model_validate({**base, "tool_choice": "required"})
    assert forced.tool_offer().auto_constraint() is None  # type: ignore[union-attr]
