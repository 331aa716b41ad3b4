"""Chat prompts: the tokenizer's chat template over the messages, with tools when offered.

`render_chat` renders with the model's own template (`apply_chat_template(messages,
tools=...)`) when the template reads `tools`; otherwise it falls back to a Hermes-style system
block, so every chat model can be offered tools:

    # Tools
    You may call one or more functions ... <tools>
    {"type": "function", "function": {"name": ..., "description": ..., "parameters": ...}}
    </tools>
    ... <tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>

In that fallback, earlier assistant tool calls are written back as `<tool_call>` blocks and tool
results as `<tool_response>` blocks, as Hermes templates do.

`tool_format_of` is the one function that chooses how a model writes its tool calls (which
parser reads them, api/tools/parsers), from its template.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

from modelyard.engine.client.protocol import Tokenizer

ChatTemplate = str | Mapping[str, str] | None  # HF `tokenizer.chat_template`

HERMES_TOOLS_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{signatures}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


class ToolFormat(enum.StrEnum):
    """How a model writes tool calls."""

    HERMES = "hermes"  # <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen, Hermes)
    LLAMA3_JSON = "llama3_json"  # {"name": ..., "parameters": {...}}, maybe <|python_tag|>
    MISTRAL = "mistral"  # [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]


def template_text(template: ChatTemplate) -> str:
    """All the text of a template (HF allows a mapping of named templates)."""
    if template is None:
        return ""
    if isinstance(template, str):
        return template
    return "\n".join(template.values())


def supports_tools(template: ChatTemplate) -> bool:
    """True when the template renders a `tools` argument itself."""
    return "tools" in template_text(template)


def chat_template_of(tokenizer: Tokenizer) -> ChatTemplate:
    """The tokenizer's chat template (HF `chat_template`; None for one without)."""
    template = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str | Mapping) else None


def tool_format_of(template: ChatTemplate) -> ToolFormat:
    """The format the model writes tool calls in: its template's, else Hermes (the fallback
    block asks for Hermes calls)."""
    text = template_text(template)
    if not supports_tools(template) or "<tool_call>" in text:
        return ToolFormat.HERMES
    if "[TOOL_CALLS]" in text:
        return ToolFormat.MISTRAL
    if "<|python_tag|>" in text or "ipython" in text:
        return ToolFormat.LLAMA3_JSON
    return ToolFormat.HERMES


def render_chat(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> list[int]:
    """The chat template over `messages` (and `tools`, OpenAI tool dicts), with the generation
    prompt, as token ids."""
    render = cast(Any, tokenizer).apply_chat_template
    if not supports_tools(chat_template_of(tokenizer)):
        if tools:
            messages, tools = hermes_fallback(messages, tools), None
        elif any(m["role"] == "tool" or m.get("tool_calls") for m in messages):
            messages = [_as_hermes_text(m) for m in messages]  # tool_choice "none" later on
    extra = {"tools": list(tools)} if tools else {}
    text = render([dict(m) for m in messages], tokenize=False, add_generation_prompt=True, **extra)
    return tokenizer.encode(str(text), add_special_tokens=False)


def hermes_fallback(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Messages for a template without tool support: the tools block joins (or becomes) the
    system message; tool calls and tool results become Hermes text."""
    signatures = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    block = HERMES_TOOLS_PROMPT.format(signatures=signatures)
    out = [_as_hermes_text(m) for m in messages]
    if out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}"}
    else:
        out.insert(0, {"role": "system", "content": block})
    return out


def _as_hermes_text(message: Mapping[str, Any]) -> dict[str, Any]:
    role, content = message["role"], message.get("content") or ""
    if role == "tool":
        return {"role": "tool", "content": f"<tool_response>\n{content}\n</tool_response>"}
    calls = message.get("tool_calls") or []
    blocks = [
        "<tool_call>\n"
        + json.dumps(
            {"name": c["function"]["name"], "arguments": _arguments_value(c["function"])},
            ensure_ascii=False,
        )
        + "\n</tool_call>"
        for c in calls
    ]
    return {"role": role, "content": "\n".join([content, *blocks] if content else blocks)}


def _arguments_value(function: Mapping[str, Any]) -> Any:
    """A call's arguments as the model wrote them: the JSON value of OpenAI's arguments string
    (the string itself when it is not JSON)."""
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
