"""The textbook endpoints, kept compatible and fixed.

Defaults (server.textbook in the config): model `smollm2-135m-instruct`, `max_tokens` 50,
`temperature` 0.7; every request may override `max_tokens`, `temperature`, `top_p`, `top_k`,
`seed`, `stop` and `model`. Prompts are used as raw text (no chat template), as in the textbook.

- `POST /basic_generate {"prompt"}` -> `{"generated_text"}`
- `POST /generate {"prompts": [...]}` -> `{"generated_texts": [...]}` in the prompts' order; all
  prompts are submitted at once and batch with everyone else's traffic.
- `POST /generate_stream {"prompt"}` -> SSE, one event per new piece of text
  `data: {"token": "<text>", "sequence_id": "<id>"}`, then the final event
  `data: {"done": true, "sequence_id", "finish_reason", "generated_text",
          "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}, "modelyard": {...}}`.
  A failure after the first byte sends `data: {"error": {...}}` as the last event instead.
- `POST /generate_vllm {"prompts"}`: see routes/vllm_compat.py.

Errors use `{"error": {"message", "type", "param", "code"}}` with the same statuses as /v1. The
generation routes go through the request path (gateway/request_path.py) like /v1's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.background import BackgroundTask
from starlette.responses import Response

from modelyard.api.errors import api_error_from_exception, request_failed
from modelyard.api.generation import Generation, Prompt, cancel_on_disconnect, open_generation
from modelyard.api.openai_format import finish_reason_of, usage_body
from modelyard.api.protocol import (
    BasicGenerateRequest,
    GenerateRequest,
    GenerateStreamRequest,
    TextbookSampling,
)
from modelyard.api.streaming import sse_error, sse_event, sse_response
from modelyard.config import TextbookConfig
from modelyard.engine.client.protocol import LLMClient
from modelyard.engine.messages import FinishReason
from modelyard.engine.sampling_params import SamplingParams
from modelyard.gateway.request_path import runs_model

router = APIRouter()


def textbook_params(body: TextbookSampling, defaults: TextbookConfig) -> SamplingParams:
    """SamplingParams with the documented defaults; ValueError names a bad field."""
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    values: dict[str, Any] = {
        "max_tokens": body.max_tokens if body.max_tokens is not None else defaults.max_tokens,
        "temperature": body.temperature if body.temperature is not None else defaults.temperature,
        "stop": stop,
        "seed": body.seed,
    }
    if body.top_p is not None:
        values["top_p"] = body.top_p
    if body.top_k is not None:
        values["top_k"] = body.top_k
    return SamplingParams(**values).validate()


async def _generate_texts(
    request: Request, body: TextbookSampling, prompts: list[str]
) -> list[str]:
    defaults: TextbookConfig = request.app.state.config.server.textbook
    params = textbook_params(body, defaults)

    async def build(llm: LLMClient) -> list[Prompt]:
        return list(prompts)

    gen: Generation | None = None
    try:
        async with cancel_on_disconnect(request):
            model = body.model or defaults.model
            gen = await open_generation(request, model, build, params, num_prompts=len(prompts))
            texts: list[list[str]] = [[] for _ in prompts]
            async for index, output in gen.all_outputs():
                for delta in output.deltas:
                    _raise_on_error(delta.finish_reason, delta.error)
                    texts[index].append(delta.text)
        return ["".join(parts) for parts in texts]
    finally:
        if gen is not None:
            await gen.aclose()


@router.post("/basic_generate")
@runs_model
async def basic_generate(body: BasicGenerateRequest, request: Request) -> dict[str, str]:
    texts = await _generate_texts(request, body, [body.prompt])
    return {"generated_text": texts[0]}


@router.post("/generate")
@runs_model
async def generate(body: GenerateRequest, request: Request) -> dict[str, list[str]]:
    return {"generated_texts": await _generate_texts(request, body, list(body.prompts))}


@router.post("/generate_stream", response_model=None)
@runs_model
async def generate_stream(body: GenerateStreamRequest, request: Request) -> Response:
    defaults: TextbookConfig = request.app.state.config.server.textbook
    params = textbook_params(body, defaults)

    async def build(llm: LLMClient) -> list[Prompt]:
        return [body.prompt]

    async with cancel_on_disconnect(request):
        gen = await open_generation(request, body.model or defaults.model, build, params)
    response = sse_response(_token_events(gen))
    response.background = BackgroundTask(gen.aclose)
    return response


async def _token_events(gen: Generation) -> AsyncIterator[bytes]:
    sequence_id = gen.streams[0].request_id
    text: list[str] = []
    finish_reason: str | None = None
    try:
        async for _, output in gen.all_outputs():
            for delta in output.deltas:
                _raise_on_error(delta.finish_reason, delta.error)
                if delta.text:
                    text.append(delta.text)
                    yield sse_event({"token": delta.text, "sequence_id": sequence_id})
                finish_reason = finish_reason_of(delta) or finish_reason
        await gen.aclose()
        tracker = gen.streams[0].tracker
        yield sse_event(
            {
                "done": True,
                "sequence_id": sequence_id,
                "finish_reason": finish_reason,
                "generated_text": "".join(text),
                "usage": usage_body(
                    tracker.prompt_tokens, tracker.completion_tokens, tracker.cached_tokens
                ),
                "modelyard": gen.timings(),
            }
        )
    except Exception as exc:
        yield sse_error(api_error_from_exception(exc))
    finally:
        await gen.aclose()


def _raise_on_error(reason: FinishReason | None, error: str | None) -> None:
    if reason == FinishReason.ERROR:
        raise request_failed(error or "engine error")
