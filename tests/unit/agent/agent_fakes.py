"""A fake modelyard for the knowledge agent's unit tests (served through httpx.MockTransport):
embeddings by hashed words, chat completions streamed as SSE, the prefix API, the model
listings with configurable capabilities, and scripted tool calls."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import httpx
import numpy as np

from modelyard.agent.agent import PLAN_PROMPT

MODEL_ID = "smollm2-135m-instruct"  # the chat model's id; "smollm2" is its alias

# A scripted reply to a chat call that offers tools: the calls [(name, arguments JSON)], or text.
ToolReply = list[tuple[str, str]] | str


def bag_of_words(text: str, dim: int = 256) -> list[float]:
    """A deterministic embedding: hashed word counts (shared words -> similar vectors)."""
    vector = np.zeros(dim)
    for word in text.lower().replace("?", " ").replace(".", " ").split():
        vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % dim] += 1.0
    return list(vector / (np.linalg.norm(vector) or 1.0))


class FakeServer:
    """Just enough of modelyard's HTTP API for the agent."""

    def __init__(self) -> None:
        self.chats: list[dict[str, Any]] = []
        self.embedded: list[list[str]] = []
        self.pins: dict[str, dict[str, Any]] = {}
        self.pin_posts = 0
        self.capabilities: dict[str, bool] | None = None  # None: no listing knows the model
        self.tool_replies: list[ToolReply] = []  # popped by each chat call that offers tools

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        path = request.url.path
        if path == "/v1/embeddings":
            self.embedded.append(body["input"])
            data = [{"index": i, "embedding": bag_of_words(t)} for i, t in enumerate(body["input"])]
            return httpx.Response(200, json={"data": data})
        if path == "/v1/chat/completions":
            return self._chat(body)
        if path in ("/v1/models", "/models"):
            return self._listing(path)
        if path == "/v1/prefixes" and request.method == "POST":
            self.pin_posts += 1
            prefix_id = f"pfx-{self.pin_posts}"
            self.pins[prefix_id] = body
            return httpx.Response(200, json={"id": prefix_id, "num_tokens": 100})
        prefix_id = path.rsplit("/", 1)[-1]
        if prefix_id not in self.pins:
            return httpx.Response(404, json={"error": {"message": "prefix not found"}})
        if request.method == "DELETE":
            del self.pins[prefix_id]
        return httpx.Response(200, json={"id": prefix_id})

    def _listing(self, path: str) -> httpx.Response:
        """/v1/models lists ids only; /models also has each model's aliases."""
        entry: dict[str, Any] = {"id": MODEL_ID}
        if self.capabilities is not None:
            entry["capabilities"] = self.capabilities
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [entry]})
        return httpx.Response(200, json={"models": [{**entry, "aliases": ["smollm2"]}]})

    def _chat(self, body: dict[str, Any]) -> httpx.Response:
        self.chats.append(body)
        if body.get("tools") and body.get("tool_choice") != "none":
            reply = self.tool_replies.pop(0)
            if not isinstance(reply, str):
                return _sse(_call_events(reply))
            return _sse(_text_events(reply, cached=0))
        first = body["messages"][0]["content"]
        if first.startswith(PLAN_PROMPT):
            text = "pinned prefix budget"
        elif "Draft answer" in body["messages"][-1]["content"]:
            text = "refined answer"
        else:
            text = "draft answer"
        return _sse(_text_events(text, cached=96 if body.get("prefix_id") else 0))


def _text_events(text: str, cached: int) -> list[dict[str, Any]]:
    words = text.split(" ")
    events = [{"choices": [{"delta": {"content": words[0]}}]}]
    events += [{"choices": [{"delta": {"content": " " + w}}]} for w in words[1:]]
    return [*events, _usage(cached)]


def _call_events(calls: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """OpenAI's streaming shape: each call's id and name first, then its arguments in pieces."""
    events: list[dict[str, Any]] = []
    for i, (name, arguments) in enumerate(calls):
        head = {"index": i, "id": f"call_{i}", "type": "function"}
        head["function"] = {"name": name, "arguments": ""}
        events.append({"choices": [{"delta": {"tool_calls": [head]}}]})
        half = len(arguments) // 2
        for piece in (arguments[:half], arguments[half:]):
            delta = {"tool_calls": [{"index": i, "function": {"arguments": piece}}]}
            events.append({"choices": [{"delta": delta}]})
    events.append({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]})
    return [*events, _usage(0)]


def _usage(cached: int) -> dict[str, Any]:
    return {
        "choices": [],
        "usage": {"prompt_tokens": 120, "completion_tokens": 2},
        "modelyard": {"cached_tokens": cached, "ttft": 0.01},
    }


def _sse(events: list[dict[str, Any]]) -> httpx.Response:
    sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})
