"""Chat prompts with tools: the model's template when it reads `tools`, else the Hermes block;
and the call format chosen from the template."""

from __future__ import annotations

import copy
import json

import pytest
from tiny_tokenizer import build_tokenizer

from modelyard.engine.client.chat_template import (
    ToolFormat,
    render_chat,
    supports_tools,
    tool_format_of,
)

pytestmark = pytest.mark.unit

TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {}}}
TURNS = [
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
]
TOOLS_TEMPLATE = (
    "{% if tools %}TOOLS={{ tools | map(attribute='function.name') | join(',') }}\n{% endif %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (None, ToolFormat.HERMES),
        ("{{ messages }}", ToolFormat.HERMES),  # no tool support: the Hermes fallback
        ("{% if tools %}<tool_call>{% endif %}", ToolFormat.HERMES),
        ("{% if tools %}<|python_tag|>{% endif %}", ToolFormat.LLAMA3_JSON),
        ("{% if tools %}[TOOL_CALLS]{% endif %}", ToolFormat.MISTRAL),
        ({"default": "{{ messages }}", "tool_use": "{{ tools }}<tool_call>"}, ToolFormat.HERMES),
    ],
)
def test_tool_format_is_chosen_from_the_template(template: object, expected: ToolFormat) -> None:
    assert tool_format_of(template) is expected  # type: ignore[arg-type]


def test_a_template_without_tools_gets_the_hermes_block_and_calls_as_text() -> None:
    tok = build_tokenizer()  # its template knows no tools
    assert not supports_tools(tok.chat_template)
    text = tok.decode(render_chat(tok, TURNS, [TOOL]))
    assert text.startswith("<|im_start|>system\n# Tools")
    assert f"<tools>\n{json.dumps(TOOL)}\n</tools>" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>' in text
    assert "<|im_start|>tool\n<tool_response>\nsunny\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert "# Tools" not in tok.decode(render_chat(tok, TURNS[:1]))  # no tools: no block


def test_earlier_calls_render_without_tools_and_arguments_strings_as_json() -> None:
    tok = build_tokenizer()  # tool_choice "none" sends no tools, but the turns keep their calls
    call = {**CALL, "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    turns = [TURNS[0], {**TURNS[1], "tool_calls": [call]}, TURNS[2]]
    text = tok.decode(render_chat(tok, turns))
    assert "# Tools" not in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "<tool_response>\nsunny\n</tool_response>" in text


def test_a_template_with_tools_renders_them_itself() -> None:
    tok = copy.deepcopy(build_tokenizer())
    tok.chat_template = TOOLS_TEMPLATE
    text = tok.decode(render_chat(tok, TURNS[:1], [TOOL]))
    assert text == "TOOLS=get_weather\nuser: Weather?\n"
