"""Retrieval as a tool: the `search_knowledge` function the agent offers a chat model, and the
pure pieces of the loop around it (agent.py runs the loop).

- **Which retrieval** (`choose_first_tool_choice`, the one place that decides): the setting
  `retrieval` is `"prompt"` (the agent embeds the question and puts the passages in the
  prompt), `"tools"` (the model searches through the tool) or `"auto"` (tools where the chat
  model's `capabilities` say `tools`, else prompt). A model that also serves structured output
  gets its first turn forced (`tool_choice: "required"`: the grammar makes even a tiny model
  write a valid call); one without gets `"auto"`, and the agent falls back to prompt retrieval
  when it answers without searching.
- **The tool**: `search_knowledge(query: string of 3..60 characters)`, no other argument (a
  forced call keeps to the schema, so a small model neither rambles nor invents arguments);
  each call is parsed (`parse_search`), run against the index (agent.py), and answered by a
  `role: "tool"` message naming the call's id (`tool_message`) that holds the passages,
  numbered as the final answer cites them.
- **The record**: every call becomes a `Search` in the answer's trace (`Answer.searches`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from modelyard.agent.api import ChatResult, ToolCall

Retrieval = Literal["auto", "tools", "prompt"]
RETRIEVALS: tuple[Retrieval, ...] = ("auto", "tools", "prompt")
FirstChoice = Literal["required", "auto"]  # the first turn's tool_choice

SEARCH_TOOL = "search_knowledge"
QUERY_MAX_CHARS = 60  # a query's bound in the tool's schema (a forced call keeps to it)
TOOL_RULES = (
    "You answer questions about modelyard, a model-serving system. First call "
    f"{SEARCH_TOOL} with the key words of the question as its query. Then answer from the "
    "passages found, in one or two short sentences, citing them as [1], [2]. If they do not "
    "say, answer: I don't know."
)


@dataclass(frozen=True, slots=True)
class Search:
    """One `search_knowledge` call of the model, as the agent ran it."""

    call_id: str  # the call's id (the tool message's `tool_call_id`)
    query: str  # the query the model wrote ("" when the call was invalid)
    k: int  # how many passages it returns at most (the agent's top_k; 0 when not run)
    chunk_ids: tuple[str, ...] = ()  # the passages found, best first
    error: str = ""  # why the call was not run (unknown tool, bad arguments)

    def as_json(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "query": self.query,
            "k": self.k,
            "chunks": list(self.chunk_ids),
            "error": self.error or None,
        }


def choose_first_tool_choice(
    retrieval: Retrieval, capabilities: dict[str, bool] | None
) -> FirstChoice | None:
    """The first turn's `tool_choice`, or None for prompt retrieval (module docstring).
    `capabilities` None: the listings do not know the model."""
    if retrieval == "prompt":
        return None
    if retrieval == "auto" and not (capabilities and capabilities.get("tools")):
        return None
    if capabilities is not None and not capabilities.get("structured_output"):
        return "auto"
    return "required"


def search_tool() -> dict[str, Any]:
    """The OpenAI function tool the agent offers."""
    parameters = {
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "minLength": 3,
                "maxLength": QUERY_MAX_CHARS,
                "description": "the key words of the question",
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    }
    description = "Search the modelyard manual for passages about the question."
    function = {"name": SEARCH_TOOL, "description": description, "parameters": parameters}
    return {"type": "function", "function": function}


def parse_search(call: ToolCall, k: int) -> Search:
    """The call as a search for k passages, or with `error` set when it cannot be run."""
    if call.name != SEARCH_TOOL:
        return Search(call.call_id, "", 0, error=f"unknown tool {call.name!r}")
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError:
        return Search(call.call_id, "", 0, error="the arguments are not JSON")
    query = arguments.get("query") if isinstance(arguments, dict) else None
    if not isinstance(query, str) or not query.strip():
        return Search(call.call_id, "", 0, error="query must be a non-empty string")
    return Search(call.call_id, query.strip(), k)


def assistant_message(turn: ChatResult) -> dict[str, Any]:
    """The model's turn, sent back before the tool results (as OpenAI's API wants it)."""
    return {
        "role": "assistant",
        "content": turn.text or None,
        "tool_calls": [call.as_message_entry() for call in turn.tool_calls],
    }


def tool_message(search: Search, passages: list[tuple[int, str]]) -> dict[str, Any]:
    """The `role: "tool"` answer to one call: its passages as `[n] text` (n the number the
    final answer cites), or the error."""
    if search.error:
        content = f"error: {search.error}"
    elif not passages:
        content = "no passages found"
    else:
        content = "\n\n".join(f"[{n}] {text}" for n, text in passages)
    return {"role": "tool", "tool_call_id": search.call_id, "content": content}
