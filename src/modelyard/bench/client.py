"""Send one request and time it: OpenAI streaming/non-streaming, /predict and KServe infer.

Every call returns a `RequestResult`, never raises for what a server does: HTTP errors, timeouts,
refused connections and malformed streams become `error` kinds (`http_503`, `timeout`,
`connection`, `malformed_stream`, `other`).

Timing of a stream (all `time.perf_counter()`, relative to the request's send time):
- TTFT: the first chunk that carries output text;
- ITL: the gap between consecutive content chunks. When the server says how many tokens a chunk
  carries (per-chunk `usage`, vLLM's `continuous_usage_stats`), a gap covering k tokens is spread
  as k gaps of gap/k (sglang's and vLLM bench's convention), so ITL is per *token*;
- output tokens: the final `usage.completion_tokens` when the server honours
  `stream_options.include_usage`, else the number of content chunks.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from modelyard.bench.workloads import RequestSpec


@dataclass(slots=True)
class RequestResult:
    """What happened to one request (times in seconds)."""

    ok: bool  # finished with a 2xx and a well-formed body
    start: float  # perf_counter() when sent, relative to the run start
    e2e: float  # send -> last byte (or -> failure)
    ttft: float | None = None  # send -> first content chunk (streaming only)
    itl: list[float] = field(default_factory=list)  # per-token gaps after the first
    prompt_tokens: int = 0  # server's usage if sent, else the workload's count
    output_tokens: int = 0  # server's usage if sent, else content chunks
    usage_reported: bool = False  # output_tokens came from the server's usage
    error: str | None = None  # error kind when not ok
    detail: str = ""  # short error text

    @property
    def tpot(self) -> float | None:
        """(e2e - ttft) / (output tokens - 1): decode time per token, None for < 2 tokens."""
        if self.ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    """Where and how to send."""

    base_url: str  # e.g. http://127.0.0.1:8000 (with or without /v1)
    model: str  # model name sent in the body (and in the KServe path)
    endpoint: str = "chat"  # chat | completions | predict | kserve
    stream: bool = True  # stream the LLM response
    ignore_eos: bool = False  # send ignore_eos=True (vLLM, modelyard)
    min_tokens: int | None = None  # send min_tokens (llama.cpp honours this one)
    include_usage: bool = True  # ask for stream_options.include_usage
    continuous_usage: bool = False  # ask for per-chunk usage (vLLM continuous_usage_stats)
    timeout_s: float = 60.0  # per-request timeout
    api_key: str | None = None  # Authorization: Bearer
    payload: dict[str, Any] | None = None  # predict/kserve: the body to send (prompt otherwise)
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into LLM bodies

    def __post_init__(self) -> None:
        if self.endpoint not in ("chat", "completions", "predict", "kserve"):
            raise ValueError("endpoint must be chat|completions|predict|kserve")
        if self.timeout_s <= 0:
            raise ValueError("timeout must be > 0")

    @property
    def is_llm(self) -> bool:
        return self.endpoint in ("chat", "completions")

    def url(self) -> str:
        root = self.base_url.rstrip("/")
        v1 = root if root.endswith("/v1") else root + "/v1"
        bare = root.removesuffix("/v1")
        return {
            "chat": v1 + "/chat/completions",
            "completions": v1 + "/completions",
            "predict": bare + "/predict",
            "kserve": f"{bare}/v2/models/{self.model}/infer",
        }[self.endpoint]

    def body(self, spec: RequestSpec) -> dict[str, Any]:
        if self.endpoint == "predict":
            return self.payload or {"model_id": self.model, "input_data": spec.prompt}
        if self.endpoint == "kserve":
            return self.payload or {
                "inputs": [
                    {"name": "text", "shape": [1], "datatype": "BYTES", "data": [spec.prompt]}
                ]
            }
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": spec.max_tokens,
            "stream": self.stream,
        }
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": spec.prompt}]
        else:
            body["prompt"] = spec.prompt
        if self.stream and (self.include_usage or self.continuous_usage):
            opts: dict[str, Any] = {"include_usage": True}
            if self.continuous_usage:
                opts["continuous_usage_stats"] = True
            body["stream_options"] = opts
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.min_tokens is not None:
            body["min_tokens"] = self.min_tokens
        body.update(self.extra_body)
        return body


class MalformedStreamError(Exception):
    """The server's SSE stream or JSON body was not what the protocol says."""


async def send(
    client: httpx.AsyncClient, cfg: EndpointConfig, spec: RequestSpec, t0: float
) -> RequestResult:
    """Send `spec`, time it relative to `t0` (the run's perf_counter start), never raise."""
    start = time.perf_counter()
    result = RequestResult(ok=False, start=start - t0, e2e=0.0, prompt_tokens=spec.prompt_tokens)
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    try:
        async with client.stream(
            "POST", cfg.url(), json=cfg.body(spec), headers=headers, timeout=cfg.timeout_s
        ) as response:
            if response.status_code >= 400:
                text = (await response.aread())[:200].decode("utf-8", "replace")
                result.error, result.detail = f"http_{response.status_code}", text
            elif cfg.is_llm and cfg.stream:
                await _read_stream(response, start, result)
                result.ok = True
            else:
                _read_body(json.loads(await response.aread()), cfg, result)
                result.ok = True
    except httpx.TimeoutException as exc:
        result.error, result.detail = "timeout", type(exc).__name__
    except (
        httpx.ConnectError,
        httpx.RemoteProtocolError,
        httpx.ReadError,
        httpx.WriteError,
    ) as exc:
        result.error, result.detail = "connection", f"{type(exc).__name__}: {exc}"[:200]
    except (MalformedStreamError, ValueError, KeyError, TypeError) as exc:
        result.error, result.detail = "malformed_stream", f"{type(exc).__name__}: {exc}"[:200]
    except httpx.HTTPError as exc:
        result.error, result.detail = "other", f"{type(exc).__name__}: {exc}"[:200]
    result.e2e = time.perf_counter() - start
    return result


def _chunk_text(chunk: dict[str, Any]) -> str:
    text = ""
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text += (delta.get("content") or "") + (delta.get("reasoning_content") or "")
        else:
            text += choice.get("text") or ""
    return text


async def _read_stream(response: httpx.Response, start: float, result: RequestResult) -> None:
    """Consume an OpenAI SSE stream into `result` (see the module docstring for the rules)."""
    last: float | None = None
    chunks = 0
    prev_usage_tokens = 0
    done = False
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        now = time.perf_counter()
        chunk = json.loads(data)
        if not isinstance(chunk, dict):
            raise MalformedStreamError("chunk is not a JSON object")
        if "error" in chunk:
            raise MalformedStreamError(f"error in stream: {chunk['error']}")
        usage = chunk.get("usage")
        usage_tokens = int(usage.get("completion_tokens") or 0) if isinstance(usage, dict) else None
        if _chunk_text(chunk):
            chunks += 1
            if last is None:
                result.ttft = now - start
            else:
                k = max(1, usage_tokens - prev_usage_tokens) if usage_tokens is not None else 1
                result.itl.extend([(now - last) / k] * k)
            last = now
        if usage_tokens is not None:
            prev_usage_tokens = usage_tokens
            result.output_tokens = usage_tokens
            result.prompt_tokens = int(usage.get("prompt_tokens") or result.prompt_tokens)  # type: ignore[union-attr]
            result.usage_reported = True
    if not done:
        raise MalformedStreamError("stream ended without [DONE]")
    if not result.usage_reported:
        result.output_tokens = chunks


def _read_body(body: Any, cfg: EndpointConfig, result: RequestResult) -> None:
    if not isinstance(body, dict):
        raise MalformedStreamError("response body is not a JSON object")
    if cfg.is_llm:
        usage = body.get("usage") or {}
        result.output_tokens = int(usage.get("completion_tokens") or 0)
        result.prompt_tokens = int(usage.get("prompt_tokens") or result.prompt_tokens)
        result.usage_reported = bool(usage)
        if not body.get("choices"):
            raise MalformedStreamError("no choices in response")
