"""OpenAI's Responses API: POST /v1/responses and GET /v1/responses/{id}.

POST /v1/responses runs the chat path: the request is translated into a chat completion
request (api/responses_protocol.py), whose messages, tool offer and constraint go through the
request path (gateway/request_path.py: auth, quotas, routing, usage) like
/v1/chat/completions; the completion, read as a chat message, becomes the output items
(api/responses_format.py). `store: true` (the default) keeps the response for
`server.responses_ttl_s` (api/responses_store.py) so GET and `previous_response_id` find it,
for the same tenant only; an unknown, expired or other tenant's id is a 404.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response

from modelyard.api.errors import APIError, api_error_from_exception, request_failed
from modelyard.api.generation import Generation, Prompt, cancel_on_disconnect, open_generation
from modelyard.api.openai_format import OpenAIFormat, usage_body
from modelyard.api.responses_format import (
    ResponseDraft,
    ResponseEvents,
    output_items,
    usage_of,
)
from modelyard.api.responses_protocol import ResponsesRequest, responses_params
from modelyard.api.responses_store import ResponseStore
from modelyard.api.routes.openai import chat_prompt, collect_choices, prepared_chat
from modelyard.api.streaming import sse_response
from modelyard.api.tools.parsing import tool_calling, with_auto_grammar
from modelyard.engine.client.protocol import LLMClient
from modelyard.engine.messages import FinishReason
from modelyard.gateway.request_path import principal_of, runs_model

router = APIRouter()

Saver = Callable[[dict[str, Any]], None]


def store_of(request: Request) -> ResponseStore:
    """The app's stored responses (made once by build_app)."""
    store: ResponseStore = request.app.state.responses
    return store


def _not_found(response_id: str, param: str | None) -> APIError:
    message = f"Response with id {response_id!r} not found."
    return APIError(404, message, param=param, code="response_not_found")


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> dict[str, Any]:
    """A stored response of the caller's tenant."""
    stored = store_of(request).get(principal_of(request).tenant, response_id)
    if stored is None:
        raise _not_found(response_id, None)
    return stored.body


@router.post("/v1/responses", response_model=None)
@runs_model
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    tenant = principal_of(request).tenant
    items = body.input_items()
    if body.previous_response_id is not None:
        previous = store_of(request).get(tenant, body.previous_response_id)
        if previous is None:
            raise _not_found(body.previous_response_id, "previous_response_id")
        items = [*previous.conversation(), *items]
    with responses_params():
        chat = body.to_chat(items)
        offer, params, messages = await prepared_chat(chat)
    tools = offer.tools if offer is not None else None

    async def build(llm: LLMClient) -> list[Prompt]:
        return [await chat_prompt(llm, messages, tools)]

    def save(response: dict[str, Any]) -> None:
        if body.store:
            store_of(request).put(tenant, response, items)

    gen: Generation | None = None
    handed_off = False
    try:
        async with cancel_on_disconnect(request):
            adapt = functools.partial(with_auto_grammar, offer) if offer is not None else None
            gen = await open_generation(
                request, body.model, build, params, priority=chat.priority, adapt_params=adapt
            )
            calling = tool_calling(offer, gen.llm.tokenizer) if offer is not None else None
            fmt = OpenAIFormat(
                chat=True,
                model=gen.model_id,
                n=1,
                tokenizer=gen.llm.tokenizer,
                tool_calling=calling,
            )
            draft = ResponseDraft(body, gen.model_id)
            if not body.stream:
                choices = await collect_choices(gen, fmt)
        if body.stream:
            events = ResponseEvents(draft)
            handed_off = True
            response = sse_response(_stream(gen, fmt, events, save))
            response.background = BackgroundTask(gen.aclose)
            return response
        await gen.aclose()
        chat_body = fmt.response(choices, usage_body(*_counts(gen)), gen.timings())
        [choice] = chat_body["choices"]
        output = output_items(choice["message"])
        finished = draft.finished(output, choice["finish_reason"], usage_of(*_counts(gen)))
        save(finished)
        return JSONResponse(finished)
    finally:
        if gen is not None and not handed_off:
            await gen.aclose()


async def _stream(
    gen: Generation, fmt: OpenAIFormat, events: ResponseEvents, save: Saver
) -> AsyncIterator[bytes]:
    """The events of one response; closes the generation (aborting it if unfinished)."""
    try:
        for event in events.start():
            yield event
        async for stream_index, output in gen.all_outputs():
            for delta in output.deltas:
                if delta.finish_reason == FinishReason.ERROR:
                    raise request_failed(delta.error or "engine error")
                for chunk in fmt.delta_chunks(stream_index, delta):
                    for event in events.chunk(chunk):
                        yield event
        await gen.aclose()
        final_events = events.finish(usage_of(*_counts(gen)))
        if events.final is not None:
            save(events.final)
        for event in final_events:
            yield event
    except Exception as exc:
        yield events.failed(api_error_from_exception(exc).body()["error"])
    finally:
        await gen.aclose()


def _counts(gen: Generation) -> tuple[int, int, int]:
    """(input, output, cached input) tokens of the response."""
    [stream] = gen.streams
    tracker = stream.tracker
    return tracker.prompt_tokens, tracker.completion_tokens, tracker.cached_tokens
