"""The knowledge agent's retrieval as a tool, against the fake server (agent_fakes.py): the
model's `search_knowledge` calls are run on the index, answered by `role: "tool"` messages, the
loop is bounded, and models without tools keep the prompt retrieval."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agent_fakes import FakeServer

from modelyard.agent import AgentConfig, KnowledgeAgent, ToolCall
from modelyard.agent.search_tool import (
    SEARCH_TOOL,
    TOOL_RULES,
    choose_first_tool_choice,
    parse_search,
)
from modelyard.cli import build_parser

pytestmark = pytest.mark.unit

EVAL = Path(__file__).parents[3] / "benchmarks" / "agent_eval"
FULL = {"chat": True, "tools": True, "structured_output": True}
QUESTION = "Which status refuses a pin over the budget?"


def search(query: str) -> tuple[str, str]:
    return (SEARCH_TOOL, json.dumps({"query": query}))


def offered(server: FakeServer) -> list[dict[str, Any]]:
    """The chat calls that offered the tools (`tool_choice: "none"` hides them)."""
    return [c for c in server.chats if c.get("tools") and c.get("tool_choice") != "none"]


async def test_the_models_queries_are_run_and_answered_as_tool_messages(
    agent: KnowledgeAgent, server: FakeServer
) -> None:
    await agent.ingest(EVAL / "knowledge")
    server.embedded.clear()
    server.capabilities = FULL
    server.tool_replies = [
        [search("pin budget status"), search("blocks of 16 tokens")],
        "It is 507 [1].",
    ]
    answer = await agent.ask(QUESTION, mode="rag")

    assert answer.retrieval == "tools"
    assert [c.step for c in answer.calls] == ["search", "retrieve", "answer", "refine"]
    assert (answer.draft, answer.text) == ("It is 507 [1].", "refined answer")
    first, second = offered(server)
    assert first["tool_choice"] == "required"
    assert first["messages"][0]["content"] == TOOL_RULES
    tool = first["tools"][0]["function"]
    assert tool["name"] == SEARCH_TOOL
    assert tool["parameters"]["required"] == ["query"]
    assert tool["parameters"]["additionalProperties"] is False  # a forced call invents nothing
    # one embeddings call: the queries and the question
    assert server.embedded == [["pin budget status", "blocks of 16 tokens", QUESTION]]

    # each search found what a direct retrieval of its query and the question finds
    assert [(s.query, s.k) for s in answer.searches] == [
        ("pin budget status", 3),
        ("blocks of 16 tokens", 3),
    ]
    for s in answer.searches:
        expected = await agent.retrieve([s.query, QUESTION], 3)
        assert s.chunk_ids == tuple(h.chunk.chunk_id for h in expected)
    assert answer.query == "pin budget status"

    # the second turn sends the calls back and answers each by its id, passages numbered
    assert second["tool_choice"] == "auto"
    assistant, *tool_messages = second["messages"][2:]
    assert assistant["role"] == "assistant"
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_0", "call_1"]
    assert assistant["tool_calls"][0]["function"]["arguments"] == search("pin budget status")[1]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_0", "call_1"]
    cited = {h.chunk.chunk_id: n for n, h in enumerate(answer.hits, start=1)}
    assert len(cited) == len({c for s in answer.searches for c in s.chunk_ids})
    for s, message in zip(answer.searches, tool_messages, strict=True):
        for chunk_id in s.chunk_ids:
            text = next(h.chunk.text for h in answer.hits if h.chunk.chunk_id == chunk_id)
            assert f"[{cited[chunk_id]}] {text}" in message["content"]

    # the refine call gets the same numbered passages, without tools
    refine = server.chats[-1]
    assert "tools" not in refine
    assert f"[1] {answer.hits[0].chunk.text}" in refine["messages"][0]["content"]
    shown = answer.as_json(chunk_text=False)
    assert shown["retrieval"] == "tools"
    assert [s["query"] for s in shown["searches"]] == ["pin budget status", "blocks of 16 tokens"]


async def test_the_loop_is_bounded_and_bad_calls_are_answered_with_errors(
    server: FakeServer, agent: KnowledgeAgent
) -> None:
    await agent.ingest(EVAL / "knowledge")
    server.capabilities = FULL
    server.tool_replies = [
        [("web_search", "{}"), (SEARCH_TOOL, "{not json"), search("  ")],
        [search("default TTL of a pin")],  # still searching when the rounds are spent
    ]
    answer = await agent.ask("What is the default TTL of a pin?", mode="rag")

    assert len(offered(server)) == 2  # max_tool_rounds
    steps = [c.step for c in answer.calls]
    assert steps == ["search", "search", "retrieve", "answer", "refine"]
    errors = [m["content"] for m in offered(server)[1]["messages"] if m["role"] == "tool"]
    assert errors == [
        "error: unknown tool 'web_search'",
        "error: the arguments are not JSON",
        "error: query must be a non-empty string",
    ]
    assert [s.error != "" for s in answer.searches] == [True, True, True, False]
    assert answer.searches[-1].chunk_ids
    assert answer.hits
    final = server.chats[-2]  # the answer call: the conversation, tools off
    assert final["tool_choice"] == "none"
    assert final["messages"][-1]["role"] == "tool"
    assert f"[1] {answer.hits[0].chunk.text}" in final["messages"][-1]["content"]
    assert answer.draft == "draft answer"


async def test_models_without_tools_keep_the_prompt_retrieval(
    server: FakeServer, agent: KnowledgeAgent, tmp_path: Path
) -> None:
    await agent.ingest(EVAL / "knowledge")
    prompt_steps = ["plan", "retrieve", "answer", "refine"]
    for capabilities in (None, {"chat": True, "tools": False, "structured_output": True}):
        server.capabilities = capabilities
        fresh = KnowledgeAgent(agent.api, agent.index_dir, agent.config)
        answer = await fresh.ask(QUESTION, mode="rag")
        assert (answer.retrieval, [c.step for c in answer.calls]) == ("prompt", prompt_steps)
        assert answer.searches == []
    assert offered(server) == []

    # tools without structured output: an unforced first turn; no call -> prompt retrieval
    server.capabilities = {"chat": True, "tools": True, "structured_output": False}
    server.tool_replies = ["I know this."]
    unforced = KnowledgeAgent(agent.api, agent.index_dir, agent.config)
    answer = await unforced.ask(QUESTION, mode="rag")
    assert offered(server)[0]["tool_choice"] == "auto"
    assert answer.retrieval == "prompt"
    assert [c.step for c in answer.calls] == ["search", *prompt_steps]
    assert answer.draft == "draft answer"

    # the setting wins over the capabilities
    server.capabilities = FULL
    config = AgentConfig(chunk_words=40, overlap_words=10, top_k=3, retrieval="prompt")
    answer = await KnowledgeAgent(agent.api, agent.index_dir, config).ask(QUESTION)
    assert answer.retrieval == "prompt"
    assert len(offered(server)) == 1


def test_the_choice_of_retrieval_and_the_parsing_of_calls() -> None:
    no_grammar = {"chat": True, "tools": True, "structured_output": False}
    assert choose_first_tool_choice("auto", FULL) == "required"
    assert choose_first_tool_choice("auto", no_grammar) == "auto"
    assert choose_first_tool_choice("auto", None) is None
    assert choose_first_tool_choice("prompt", FULL) is None
    assert choose_first_tool_choice("tools", None) == "required"  # unknown: try forcing
    call = ToolCall("c", SEARCH_TOOL, '{"query": " evict "}')
    assert (parse_search(call, 4).query, parse_search(call, 4).k) == ("evict", 4)
    assert parse_search(ToolCall("c", SEARCH_TOOL, "[1]"), 4).error
    with pytest.raises(ValueError, match="retrieval"):
        AgentConfig(retrieval="grep")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_tool_rounds"):
        AgentConfig(max_tool_rounds=0)
    parser = build_parser("agent")
    args = parser.parse_args(["agent", "ask", "why?", "--retrieval", "tools"])
    assert (args.retrieval, args.max_tool_rounds) == ("tools", 2)
