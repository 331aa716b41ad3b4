"""`ModelyardAPI`: the agent's only way to the models, modelyard's own HTTP API.

It uses `/v1/embeddings`, `/v1/chat/completions` (streamed, to time the first token; with
function tools when asked), the prefix API (`/v1/prefixes`) and the model listings
(`/v1/models`, `/models`: what a chat model can do), so an agent runs alike against a local
`modelyard serve`, a server behind the gateway (pass `api_key`) or a Ray Serve cluster's
ingress.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt


class ModelyardAPIError(RuntimeError):
    """The server answered an error (status and the OpenAI envelope's message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call the model made (`message.tool_calls[i]`)."""

    call_id: str  # the call's `id`, which the `role: "tool"` answer names (`tool_call_id`)
    name: str  # the function's name
    arguments: str  # the arguments, a JSON text as the model wrote it

    def as_message_entry(self) -> dict[str, Any]:
        """The call as an assistant message's `tool_calls` entry (to send the turn back)."""
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.call_id, "type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ChatResult:
    """One chat completion as the agent saw it."""

    text: str  # the generated text
    ttft_s: float  # client-side: request sent -> first content token received
    e2e_s: float  # client-side: request sent -> stream finished
    prompt_tokens: int  # the prompt's tokens (as the server counted them)
    cached_tokens: int  # prompt tokens served from the prefix cache (pinned or not)
    completion_tokens: int  # generated tokens
    server_ttft_s: float | None  # the server's own TTFT (arrival -> first token)
    tool_calls: tuple[ToolCall, ...] = ()  # the function calls, when tools were offered


class ModelyardAPI:
    """An async client of one modelyard server (close it with `aclose`)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s, transport=transport
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def embed(self, texts: list[str], *, model: str) -> npt.NDArray[np.float32]:
        """(len(texts), dim) float32 embeddings, in input order."""
        body = await self._json("POST", "/v1/embeddings", {"model": model, "input": texts})
        rows = sorted(body["data"], key=lambda d: d["index"])
        return np.asarray([r["embedding"] for r in rows], dtype=np.float32)

    async def capabilities(self, model: str) -> dict[str, bool] | None:
        """What the chat model `model` (an id, a name or an alias) serves, as the listings give
        it (`{"chat", "tools", "structured_output"}`); None when no listing knows it as an LLM."""
        listed = await self._json("GET", "/v1/models")
        for entry in listed.get("data", []):
            if entry.get("id") == model and isinstance(entry.get("capabilities"), dict):
                return dict(entry["capabilities"])
        catalog = await self._json("GET", "/models")
        for entry in catalog.get("models", []):
            names = {entry.get("id"), entry.get("name"), *(entry.get("aliases") or [])}
            if model in names and isinstance(entry.get("capabilities"), dict):
                return dict(entry["capabilities"])
        return None

    async def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        model: str,
        max_tokens: int,
        temperature: float = 0.0,
        prefix_id: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | None = None,
    ) -> ChatResult:
        """A streamed chat completion, timed from the request to the first content token (or
        tool call). `tools` and `tool_choice` as in OpenAI's API; the calls come back in
        `ChatResult.tool_calls`."""
        payload: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if prefix_id is not None:
            payload["prefix_id"] = prefix_id
        if tools is not None:
            payload["tools"] = tools
        if tool_choice is not None:
            payload["tool_choice"] = tool_choice
        start = time.perf_counter()
        first: float | None = None
        pieces: list[str] = []
        calls: dict[int, dict[str, str]] = {}  # index -> id, name, arguments (accumulated)
        usage: dict[str, Any] = {}
        timings: dict[str, Any] = {}
        async with self._http.stream("POST", "/v1/chat/completions", json=payload) as response:
            if response.status_code != 200:
                await response.aread()
                raise ModelyardAPIError(response.status_code, _message(response))
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    raise ModelyardAPIError(500, str(event["error"].get("message")))
                for choice in event.get("choices", []):
                    delta = choice.get("delta", {})
                    content = delta.get("content")
                    if content or delta.get("tool_calls"):
                        first = first if first is not None else time.perf_counter()
                    if content:
                        pieces.append(content)
                    _add_call_deltas(calls, delta.get("tool_calls") or [])
                usage = event.get("usage") or usage
                timings = event.get("modelyard") or timings
        end = time.perf_counter()
        return ChatResult(
            text="".join(pieces),
            ttft_s=(first if first is not None else end) - start,
            e2e_s=end - start,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            cached_tokens=int(timings.get("cached_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            server_ttft_s=timings.get("ttft"),
            tool_calls=tuple(
                ToolCall(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items())
            ),
        )

    async def pin_prefix(
        self, *, model: str, messages: list[dict[str, str]], ttl_s: float
    ) -> dict[str, Any]:
        """POST /v1/prefixes with chat messages; the prefix object."""
        payload = {"model": model, "messages": messages, "ttl_s": ttl_s}
        return await self._json("POST", "/v1/prefixes", payload)

    async def get_prefix(self, prefix_id: str) -> dict[str, Any] | None:
        """The prefix object, or None when it is gone (expired, deleted, model unloaded)."""
        try:
            return await self._json("GET", f"/v1/prefixes/{prefix_id}")
        except ModelyardAPIError as exc:
            if exc.status == 404:
                return None
            raise

    async def delete_prefix(self, prefix_id: str) -> bool:
        try:
            await self._json("DELETE", f"/v1/prefixes/{prefix_id}")
        except ModelyardAPIError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def _json(self, method: str, path: str, payload: Any = None) -> dict[str, Any]:
        response = await self._http.request(method, path, json=payload)
        if response.status_code != 200:
            raise ModelyardAPIError(response.status_code, _message(response))
        body: dict[str, Any] = response.json()
        return body


def _add_call_deltas(calls: dict[int, dict[str, str]], deltas: list[dict[str, Any]]) -> None:
    """Fold streamed `delta.tool_calls` entries into `calls`: an entry's first delta brings its
    id and name, the arguments may come in pieces (OpenAI's streaming shape)."""
    for delta in deltas:
        call = calls.setdefault(int(delta.get("index", 0)), {"id": "", "name": "", "arguments": ""})
        function = delta.get("function") or {}
        call["id"] = delta.get("id") or call["id"]
        call["name"] = function.get("name") or call["name"]
        call["arguments"] += function.get("arguments") or ""


def _message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error")
    except ValueError:
        return response.text[:500]
    if isinstance(error, dict):
        return str(error.get("message"))
    return str(error)
