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
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        (c.name, json.loads(c.arguments)) for c in (WEATHER, TIME)
    ]
    assert parsed.calls[0] == WEATHER  # the arguments as written
    assert parsed.content == content


@pytest.mark.parametrize("tool_format", list(ToolFormat))
def test_plain_text_is_content(tool_format: ToolFormat) -> None:
    parsed = parser_for(tool_format).parse("  The answer is 42.  ", final=True)
    assert (parsed.content, parsed.calls) == ("The answer is 42.", [])


def test_hermes_block_without_a_name_stays_content_and_an_unclosed_one_is_a_call() -> None:
    parser = parser_for(ToolFormat.HERMES)
    for broken in ("<tool_call>{not json}</tool_call>", '<tool_call>{"x": 1}</tool_call>'):
        assert parser.parse(broken, final=True).content == broken
    unclosed = 'ok <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool'
    assert parser.parse(unclosed, final=True).calls == [WEATHER]
    assert parser.parse(unclosed, final=True).content == "ok"


def test_llama_text_that_does_not_start_with_a_call_is_content() -> None:
    text = 'I would call {"name": "x", "parameters": {}}'
    parsed = parser_for(ToolFormat.LLAMA3_JSON).parse(text, final=True)
    assert (parsed.content, parsed.calls) == (text, [])


def assemble(calling: ToolCalling, pieces: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """Content and calls as a client assembles them from the streamed pieces; each call also
    records how many argument fragments it came in."""
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
                calls.append({"name": entry["function"]["name"], "arguments": "", "parts": 0})
            else:  # later entries: the index and an arguments fragment, no other id
                assert set(entry) == {"index", "function"}
                assert set(entry["function"]) == {"arguments"}
                assert entry["function"]["arguments"]
                calls[entry["index"]]["arguments"] += entry["function"]["arguments"]
                calls[entry["index"]]["parts"] += 1
    return content, calls


def chunked(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def assert_stream_matches_message(calling: ToolCalling, text: str, size: int) -> None:
    """The invariant: the streamed content and calls equal the non-streamed message."""
    content, calls = assemble(calling, chunked(text, size))
    message = calling.message(text)
    assert content.strip() == (message.get("content") or "").strip()
    assert [{"name": c["name"], "arguments": c["arguments"]} for c in calls] == [
        c["function"] for c in message.get("tool_calls", [])
    ]


@pytest.mark.parametrize(
    ("tool_format", "text"),
    [(ToolFormat.HERMES, HERMES), (ToolFormat.LLAMA3_JSON, LLAMA), (ToolFormat.MISTRAL, MISTRAL)],
)
@pytest.mark.parametrize("size", [1, 3, 7])
def test_streamed_fragments_assemble_to_the_whole_text_parse(
    tool_format: ToolFormat, text: str, size: int
) -> None:
    calling = ToolCalling(parser_for(tool_format))
    assert_stream_matches_message(calling, text, size)
    calls = assemble(calling, chunked(text, size))[1]
    assert [json.loads(c["arguments"]) for c in calls] == [
        {"city": "Paris"},
        json.loads(TIME.arguments),
    ]
    # an object's arguments stream as they are written (a JSON string's come whole)
    assert calls[0]["parts"] > 1


ARGS_FIRST = '<tool_call>{"arguments": {"city": "Paris"}, "name": "get_weather"}</tool_call>'
ESCAPES = '<tool_call>{"name": "say", "arguments": {"text": "a \\"}\\" {[", "n": -1.5}}</tool_call>'
NO_ARGS = '{"name": "get_time"}; {"name": "get_weather", "parameters": {}}'


@pytest.mark.parametrize(
    ("tool_format", "text"),
    [
        (ToolFormat.HERMES, ARGS_FIRST),
        (ToolFormat.HERMES, ESCAPES),
        (ToolFormat.LLAMA3_JSON, NO_ARGS),
        (ToolFormat.LLAMA3_JSON, NO_ARGS + "; and some words"),
        (ToolFormat.MISTRAL, '[TOOL_CALLS]{"name": "get_weather", "arguments": {"city": "P"}}'),
        # cut by max_tokens: the arguments written so far, streamed and not
        (ToolFormat.HERMES, HERMES[:-30]),
        (ToolFormat.LLAMA3_JSON, LLAMA[:-9]),
        (ToolFormat.MISTRAL, MISTRAL[:75]),
        (ToolFormat.MISTRAL, MISTRAL[:-12]),
    ],
)
@pytest.mark.parametrize("size", [1, 2, 5])
def test_edge_cases_stream_as_the_whole_text_parses(
    tool_format: ToolFormat, text: str, size: int
) -> None:
    assert_stream_matches_message(ToolCalling(parser_for(tool_format)), text, size)


def test_arguments_before_the_name_wait_for_it_and_escapes_do_not_end_the_object() -> None:
    message = ToolCalling(parser_for(ToolFormat.HERMES)).message(ARGS_FIRST + ESCAPES)
    arguments = [c["function"]["arguments"] for c in message["tool_calls"]]
    assert arguments == ['{"city": "Paris"}', '{"text": "a \\"}\\" {[", "n": -1.5}']
    assert json.loads(arguments[1]) == {"text": 'a "}" {[', "n": -1.5}
    stream = ToolCalling(parser_for(ToolFormat.HERMES)).stream()
    assert stream.feed(ARGS_FIRST[:-30]).tool_calls == []  # no name yet: nothing sent
    head, rest = stream.feed(ARGS_FIRST[-30:]).tool_calls
    assert (head["function"]["name"], rest["function"]["arguments"]) == (
        "get_weather",
        '{"city": "Paris"}',
    )


@pytest.mark.parametrize("tool_format", list(ToolFormat))
def test_malformed_strings_and_keys_never_raise(tool_format: ToolFormat) -> None:
    for body in ('{"na\\xme": "f"}', '{"name": "f\\q", "arguments": {}}', '{"name": 3}'):
        text = {"hermes": f"<tool_call>{body}</tool_call>", "mistral": f"[TOOL_CALLS]{body}"}
        text_of = text.get(tool_format.value, body)
        assert_stream_matches_message(ToolCalling(parser_for(tool_format)), text_of, 2)
        assert "tool_calls" not in ToolCalling(parser_for(tool_format)).message(text_of)
    arguments = '{"name": "f", "arguments": "{\\"a\\": \\q"}'
    assert parser_for(ToolFormat.LLAMA3_JSON).parse(arguments, final=True).calls[0].arguments == (
        '"{\\"a\\": \\q"'
    )


def test_a_cut_call_carries_what_was_written() -> None:
    cut = 'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'
    message = ToolCalling(parser_for(ToolFormat.HERMES)).message(cut)
    assert message["content"] == "Hi"
    assert message["tool_calls"][0]["function"]["arguments"] == '{"city": "Pa'
    before_name = 'Hi <tool_call>\n{"name": "get_wea'
    message = ToolCalling(parser_for(ToolFormat.HERMES)).message(before_name)
    assert message == {"role": "assistant", "content": before_name}


def test_streaming_holds_back_a_possible_marker_and_releases_plain_text() -> None:
    stream = ToolCalling(parser_for(ToolFormat.HERMES)).stream()
    assert stream.feed("Hello <tool").content == "Hello "
    assert stream.feed("box> and").content == "<toolbox> and"
    assert stream.finish().content == ""
    llama = ToolCalling(parser_for(ToolFormat.LLAMA3_JSON)).stream()
    assert llama.feed("  ").content == ""
    assert llama.feed("Hi").content == "  Hi"


def test_a_call_starts_once_its_name_is_known_and_parallel_false_keeps_one() -> None:
    stream = ToolCalling(parser_for(ToolFormat.HERMES)).stream()
    name_end = HERMES.index('"get_weather"') + len('"get_weather"')
    assert stream.feed(HERMES[: name_end - 1]).tool_calls == []
    assert [e["function"] for e in stream.feed(HERMES[name_end - 1 : name_end]).tool_calls] == [
        {"name": "get_weather", "arguments": ""}
    ]
    assert stream.feed(', "arguments": {"ci').tool_calls[0]["function"] == {"arguments": '{"ci'}
    single = ToolCalling(parser_for(ToolFormat.HERMES), parallel=False)
    assert len(single.message(HERMES)["tool_calls"]) == 1
    for size in (1, 4):
        assert_stream_matches_message(single, HERMES, size)
        assert [c["name"] for c in assemble(single, chunked(HERMES, size))[1]] == ["get_weather"]


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
        [{"name": "get_weather", "arguments": WEATHER.arguments, "parts": 1}],
    )
    auto = ToolCalling(parser_for(ToolFormat.HERMES)).message(cut)
    assert auto["content"] == '<tool_call>\n{"name": "get_ti'
