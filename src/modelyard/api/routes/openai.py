"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models.

Non-streaming responses carry `x-modelyard-queue-time` / `x-modelyard-ttft` headers (seconds)
and the `modelyard` timings field; streams end with `data: [DONE]`, preceded by an error event
if they fail after the first byte. The generation routes go through the request path
(gateway/request_path.py), which adds `x-modelyard-route` to every response. `/v1/models` lists
what the caller may use.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import APIRouter, Request
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response

from modelyard.api.errors import api_error_from_exception, request_failed
from modelyard.api.generation import (
    Generation,
    Prompt,
    PromptBuilder,
    cancel_on_disconnect,
    open_generation,
)
from modelyard.api.listing import may_call, visible_model_names
from modelyard.api.openai_format import ChoiceText, OpenAIFormat, finish_reason_of, usage_body
from modelyard.api.protocol import ChatCompletionRequest, CompletionRequest, StreamOptions
from modelyard.api.routes.prefixes import resolve_named_prefix
from modelyard.api.streaming import SSE_DONE, sse_error, sse_event, sse_response
from modelyard.api.structured import check_constraint, compiles
from modelyard.api.tools.definitions import ToolOffer
from modelyard.api.tools.parsing import tool_calling, with_auto_grammar
from modelyard.engine.client.errors import MissingCapabilityError
from modelyard.engine.client.protocol import LLMClient
from modelyard.engine.messages import FinishReason
from modelyard.engine.sampling_params import SamplingParams
from modelyard.gateway.request_path import provider_of, runs_model

router = APIRouter()

#: Chat templates of longer conversations are rendered off the event loop.
_INLINE_TEMPLATE_CHARS = 4096


@router.post("/v1/chat/completions", response_model=None)
@runs_model
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    offer, params, messages = await prepared_chat(body)
    tools = offer.tools if offer is not None else None

    async def build(llm: LLMClient) -> list[Prompt]:
        head: list[int] = []
        full = messages
        if body.prefix_id is not None:
            pinned = resolve_named_prefix(request, llm, body.prefix_id, body.model)
            if pinned.messages is not None:
                full = [*pinned.messages, *messages]
            else:
                head = pinned.token_ids
        return [head + await chat_prompt(llm, full, tools)]

    return await serve_openai(
        request,
        body.model,
        build,
        params,
        body.priority,
        body.stream,
        body.stream_options,
        chat=True,
        tools=offer,
    )


async def prepared_chat(
    body: ChatCompletionRequest,
) -> tuple[ToolOffer | None, SamplingParams, list[dict[str, Any]]]:
    """A chat request checked (tools, sampling, its constraint compiled off the event loop):
    its tool offer (in auto mode with the grammar of calls, when it compiles), sampling params
    and template messages; 400s for what is malformed."""
    offer = body.checked_tool_offer()
    params = body.to_sampling_params()
    await check_constraint(body.requested_constraint())
    if offer is not None and params.constraint is None:
        grammar = offer.auto_constraint()
        if grammar is not None and await compiles(grammar):
            offer = dataclasses.replace(offer, auto_grammar=grammar)
    return offer, params, [m.as_template_message() for m in body.messages]


async def chat_prompt(
    llm: LLMClient, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[int]:
    """The prompt of a conversation through the model's chat template (long ones or ones with
    tools rendered off the event loop); MissingCapabilityError when tools meet a model
    without them."""
    if tools and not llm.capabilities.tools:
        raise MissingCapabilityError(llm.model_name, "tools")
    if sum(len(m["content"] or "") for m in messages) > _INLINE_TEMPLATE_CHARS or tools:
        return await asyncio.to_thread(llm.apply_chat_template, messages, tools)
    return llm.apply_chat_template(messages)


@router.post("/v1/completions", response_model=None)
@runs_model
async def completions(body: CompletionRequest, request: Request) -> Response:
    params = body.to_sampling_params()
    await check_constraint(body.requested_constraint())
    prompts = body.prompts()

    async def build(llm: LLMClient) -> list[Prompt]:
        if body.prefix_id is None:
            return list(prompts)
        head = resolve_named_prefix(request, llm, body.prefix_id, body.model).token_ids
        return [head + _token_ids(llm, p) for p in prompts]

    return await serve_openai(
        request,
        body.model,
        build,
        params,
        body.priority,
        body.stream,
        body.stream_options,
        chat=False,
        num_prompts=len(prompts),
    )


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    """OpenAI model list: the catalog ids and route names the caller may use, then the LoRA
    adapters it may use, each with its base model as `parent` (as vLLM lists them). An LLM's
    entry (an adapter's: its base's) also has `capabilities` (listing.py)."""
    created = int(request.app.state.started_at)
    names = visible_model_names(request)
    data = [_model_entry(name, created, capabilities) for name, capabilities in names.items()]
    data += [
        {**_model_entry(a.name, created, names.get(a.base)), "parent": a.base}
        for a in provider_of(request).adapters()
        if may_call(request, a.name)
    ]
    return {"object": "list", "data": data}


def _model_entry(name: str, created: int, capabilities: dict[str, bool] | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": name, "object": "model", "created": created}
    entry["owned_by"] = "modelyard"
    if capabilities is not None:
        entry["capabilities"] = capabilities
    return entry


async def serve_openai(
    request: Request,
    model: str,
    build: PromptBuilder,
    params: SamplingParams,
    priority: int,
    stream: bool,
    stream_options: StreamOptions | None,
    *,
    chat: bool,
    num_prompts: int = 1,
    tools: ToolOffer | None = None,
) -> Response:
    """Run one OpenAI request to a JSON response or an SSE stream."""
    gen: Generation | None = None
    handed_off = False
    try:
        async with cancel_on_disconnect(request):
            adapt = functools.partial(with_auto_grammar, tools) if tools is not None else None
            gen = await open_generation(
                request,
                model,
                build,
                params,
                priority=priority,
                num_prompts=num_prompts,
                adapt_params=adapt,
            )
            tokenizer = gen.llm.tokenizer
            calling = tool_calling(tools, tokenizer) if tools is not None else None
            fmt = OpenAIFormat(
                chat=chat, model=gen.model_id, n=params.n, tokenizer=tokenizer, tool_calling=calling
            )
            if not stream:
                choices = await collect_choices(gen, fmt)
        headers: dict[str, str] = {}
        if stream:
            include_usage = bool(stream_options and stream_options.include_usage)
            events = stream_events(gen, fmt, include_usage=include_usage)
            handed_off = True
            response = sse_response(events, headers)
            response.background = BackgroundTask(gen.aclose)
            return response
        await gen.aclose()
        usage = usage_body(*_token_counts(gen))
        timings = gen.timings()
        headers.update(_timing_headers(timings))
        return JSONResponse(fmt.response(choices, usage, timings), headers=headers)
    finally:
        if gen is not None and not handed_off:
            await gen.aclose()


async def collect_choices(gen: Generation, fmt: OpenAIFormat) -> dict[int, ChoiceText]:
    """Read every output to the end; an engine error fails the whole request."""
    choices: dict[int, ChoiceText] = {}
    async for stream_index, output in gen.all_outputs():
        for delta in output.deltas:
            if delta.finish_reason == FinishReason.ERROR:
                raise request_failed(delta.error or "engine error")
            choice = choices.setdefault(fmt.choice_index(stream_index, delta), ChoiceText())
            choice.text.append(delta.text)
            if delta.logprobs:
                choice.logprobs.extend(delta.logprobs)
            if delta.finish_reason is not None:
                choice.finish_reason = finish_reason_of(delta)
    return choices


async def stream_events(
    gen: Generation, fmt: OpenAIFormat, *, include_usage: bool
) -> AsyncIterator[bytes]:
    """SSE events of one request; closes the generation (aborting it if unfinished)."""
    try:
        if fmt.chat:
            yield sse_event(fmt.role_chunk(len(gen.streams) * fmt.n))
        async for stream_index, output in gen.all_outputs():
            for delta in output.deltas:
                if delta.finish_reason == FinishReason.ERROR:
                    raise request_failed(delta.error or "engine error")
                for chunk in fmt.delta_chunks(stream_index, delta):
                    yield sse_event(chunk)
        await gen.aclose()
        if include_usage:
            yield sse_event(fmt.usage_chunk(usage_body(*_token_counts(gen)), gen.timings()))
    except Exception as exc:
        yield sse_error(api_error_from_exception(exc))
    finally:
        await gen.aclose()
    yield SSE_DONE


def _token_ids(llm: LLMClient, prompt: Prompt) -> list[int]:
    """A prompt that follows a pinned prefix, as token ids (no special tokens added)."""
    if isinstance(prompt, str):
        return llm.tokenizer.encode(prompt, add_special_tokens=False)
    return list(prompt)


def _token_counts(gen: Generation) -> tuple[int, int, int]:
    """(prompt, completion, cached prompt) tokens of every stream."""
    streams: Sequence[Any] = gen.streams
    prompt = sum(s.tracker.prompt_tokens for s in streams)
    completion = sum(s.tracker.completion_tokens for s in streams)
    cached = sum(s.tracker.cached_tokens for s in streams)
    return prompt, completion, cached


def _timing_headers(timings: dict[str, Any]) -> dict[str, str]:
    headers = {}
    for key, header in (("queue_time", "x-modelyard-queue-time"), ("ttft", "x-modelyard-ttft")):
        if timings.get(key) is not None:
            headers[header] = f"{timings[key]:.6f}"
    return headers
