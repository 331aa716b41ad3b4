"""Tool-call parsers (Hermes, Llama 3 JSON, Mistral), whole texts and streamed fragments."""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelyard.api.tools.base import ParsedCall
from modelyard.api.tools.parsing import ToolCalling, parser_for
from modelyard.engine.client.chat_template import ToolFormat

pytestmark = pytest.mark.unit

WEATHER = ParsedCall("get_weather", '{"city": "Paris"}')
TIME = ParsedCall("get_time", '{"zone": "CET", "n": [1, 2]}')

HERMES = (
    "Let me check. <tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>{"name":"get_time","arguments":{"zone":"CET","n":[1,2]}}</tool_call>'
)
LLAMA = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; ' + (
    '{"name": "get_time", "parameters": {"zone": "CET", "n": [1, 2]}}'
)
MISTRAL = (
    'Sure [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
    '{"name": "get_time", "arguments": "{\\"zone\\": \\"CET\\", \\"n\\": [1, 2]}"}]'
)


@pytest.mark.parametrize(
    ("tool_format", "text", "content"),
    [
        (ToolFormat.HERMES, HERMES, "Let me check."),
        (ToolFormat.LLAMA3_JSON, LLAMA, ""),
        (ToolFormat.MISTRAL, MISTRAL, "Sure"),
    ],
)
def test_each_parser_reads_two_calls_and_the_content(
    tool_format: ToolFormat, text: str, content: str
) -> None:
    parsed = parser_for(tool_format).parse(text, final=True)
    assert parsed.calls == [WEATHER, TIME]
    assert parsed.content == content


@pytest.mark.parametrize("tool_format", list(ToolFormat))
def test_plain_text_is_content(tool_format: ToolFormat) -> None:
    parsed = parser_for(tool_format).parse("  The answer is 42.  ", final=True)
    assert (parsed.content, parsed.calls) == ("The answer is 42.", [])


def test_hermes_malformed_block_stays_content_and_unclosed_last_call_counts_at_the_end() -> None:
    parser = parser_for(ToolFormat.HERMES)
    broken = "<tool_call>{not json}</tool_call>"
    assert parser.parse(broken, final=True).content == broken
    unclosed = 'ok <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert parser.parse(unclosed, final=False).calls == []
    assert parser.parse(unclosed, final=True).calls == [WEATHER]


def test_llama_text_that_does_not_start_with_a_call_is_content() -> None:
    text = 'I would call {"name": "x", "parameters": {}}'
    parsed = parser_for(ToolFormat.LLAMA3_JSON).parse(text, final=True)
    assert (parsed.content, parsed.calls) == (text, [])


def assemble(calling: ToolCalling, pieces: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """Content and calls as a client assembles them from the streamed pieces."""
    stream = calling.stream()
    content, calls = "", []
    fed = [stream.feed(p) for p in pieces]
    for piece in [*fed, stream.finish()]:
        content += piece.content
        for entry in piece.tool_calls:
            if "id" in entry:
                assert entry["type"] == "function"
                assert entry["function"]["arguments"] == ""
                assert entry["id"].startswith("call_")
                assert entry["index"] == len(calls)
                calls.append({"name": entry["function"]["name"], "arguments": ""})
            else:
                assert set(entry) == {"index", "function"}
                calls[entry["index"]]["arguments"] += entry["function"]["arguments"]
    return content, calls


@pytest.mark.parametrize(
    ("tool_format", "text"),
    [(ToolFormat.HERMES, HERMES), (ToolFormat.LLAMA3_JSON, LLAMA), (ToolFormat.MISTRAL, MISTRAL)],
)
@pytest.mark.parametrize("size", [1, 3, 7])
def test_streamed_fragments_assemble_to_the_whole_text_parse(
    tool_format: ToolFormat, text: str, size: int
) -> None:
    calling = ToolCalling(parser_for(tool_format))
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    content, calls = assemble(calling, pieces)
    message = calling.message(text)
    assert content.strip() == (message["content"] or "")
    expected = [c["function"] for c in message["tool_calls"]]
    assert calls == expected
    assert [json.loads(c["arguments"]) for c in calls] == [
        {"city": "Paris"},
        json.loads(TIME.arguments),
    ]


def test_streaming_holds_back_a_possible_marker_and_releases_plain_text() -> None:
    stream = ToolCalling(parser_for(ToolFormat.HERMES)).stream()
    assert stream.feed("Hello <tool").content == "Hello "
    assert stream.feed("box> and").content == "<toolbox> and"
    assert stream.finish().content == ""
    llama = ToolCalling(parser_for(ToolFormat.LLAMA3_JSON)).stream()
    assert llama.feed("  ").content == ""
    assert llama.feed("Hi").content == "  Hi"


def test_a_call_is_sent_as_soon_as_it_is_complete_and_parallel_false_keeps_one() -> None:
    stream = ToolCalling(parser_for(ToolFormat.HERMES)).stream()
    first_half, second_half = HERMES[:100], HERMES[100:]
    assert len(stream.feed(first_half).tool_calls) == 2  # the first call: head + arguments
    assert len(stream.feed(second_half).tool_calls) == 2
    assert stream.finish().tool_calls == []
    single = ToolCalling(parser_for(ToolFormat.HERMES), parallel=False)
    assert len(single.message(HERMES)["tool_calls"]) == 1
    assert assemble(single, [HERMES])[1] == [
        {"name": "get_weather", "arguments": WEATHER.arguments}
    ]


def test_finish_reason_is_tool_calls_unless_a_function_was_named() -> None:
    auto = ToolCalling(parser_for(ToolFormat.HERMES))
    named = ToolCalling(parser_for(ToolFormat.HERMES), named=True)
    assert auto.finish_reason("stop", called=True) == "tool_calls"
    assert auto.finish_reason("stop", called=False) == "stop"
    assert auto.finish_reason("length", called=True) == "length"
    assert named.finish_reason("stop", called=True) == "stop"


def test_forced_calls_cut_by_max_tokens_leave_no_content() -> None:
    """A forced output is only calls: an unfinished one after a complete one (max_tokens) is
    dropped, not sent as content (auto mode keeps it: a model may write anything)."""
    cut = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    cut += '\n<tool_call>\n{"name": "get_ti'
    forced = ToolCalling(parser_for(ToolFormat.HERMES), forced=True)
    message = forced.message(cut)
    assert (message["content"], len(message["tool_calls"])) == (None, 1)
    assert assemble(forced, [cut[:30], cut[30:]]) == (
        "",
        [{"name": "get_weather", "arguments": WEATHER.arguments}],
    )
    auto = ToolCalling(parser_for(ToolFormat.HERMES)).message(cut)
    assert auto["content"] == '<tool_call>\n{"name": "get_ti'
