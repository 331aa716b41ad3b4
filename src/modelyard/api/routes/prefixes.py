"""The prefix API (CAG): pin a knowledge prefix in a model's KV cache, list it, release it.

- `POST /v1/prefixes` `{"model", one of "text" | "token_ids" | "messages", "ttl_s"?,
  "cache_salt"?}` prefills the prefix once and pins its full KV blocks (engine/core/prefixes.py);
  answers the prefix object (`id`, `model`, `num_tokens`, `num_pinned_tokens`, `num_blocks`,
  `expires_at`, `hits`...) once the blocks are pinned. `messages` are chat messages (typically
  one system message with the knowledge) rendered with the model's chat template as the
  opening of a conversation.
- `GET /v1/prefixes[?model=M]` lists the caller's live pins with the pin budget of each model it
  may use (`M`: any name of one model);
  `GET /v1/prefixes/{id}` one pin; `DELETE /v1/prefixes/{id}` releases it.
- `/v1/chat/completions` and `/v1/completions` accept `"prefix_id"`: the pin's messages are put
  before the request's messages (a text or token-id pin: its tokens before the prompt), so the
  prompt starts with the pinned tokens. Any request whose prompt starts with those tokens
  reuses the pinned blocks, named or not: that is plain prefix caching, within one prefix-cache
  salt (the request's `cache_salt` and, with `salt_by_tenant`, the tenant's: a pin serves the
  requests of its own salt only).

`POST` goes through the request path (gateway/request_path.py) like every model route:
authorize, route, admit (the prefix's tokens count against tokens-per-minute), lease.
Scope: whoever may use a model may pin prefixes on it; a pin belongs to
the tenant that made it: other tenants neither see, name nor delete it (admins see and delete
every pin). Pins count against the model's KV cache: over the budget the answer is 507
(`pin_budget_exceeded`), over the tenant's share of it (gateway.pins.share) 507
(`pin_share_exceeded`). Pins end at their TTL (default 1 h, at most gateway.pins.max_ttl_s),
on DELETE, or when the model is unloaded. The tenant policy is gateway/pin_policy.py.

Errors use the OpenAI envelope: 400 bad input or a TTL past the tenant's limit, 403 model not
allowed, 404 unknown prefix or model, 507 over the pin budget or the tenant's share, 503 model
unavailable or the engine failed the pin.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from typing import Any, cast

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from modelyard.api.errors import APIError
from modelyard.api.listing import may_call
from modelyard.api.protocol import ChatMessage
from modelyard.engine.client.prefixes import (
    DEFAULT_PREFIX_TTL_S,
    MAX_PREFIX_TTL_S,
    EnginePrefixes,
    PinnedPrefix,
    PrefixBudgetError,
    PrefixPinError,
    PrefixShareError,
)
from modelyard.engine.client.protocol import LLMClient
from modelyard.gateway.base import Principal
from modelyard.gateway.pin_policy import PinPolicy
from modelyard.gateway.request_path import (
    Demand,
    RequestPath,
    principal_of,
    runs_model,
    ticket_of,
)
from modelyard.manager.base import Lease

router = APIRouter()

_INLINE_TOKENIZE_CHARS = 4096


class PrefixRequest(BaseModel):
    """POST /v1/prefixes."""

    model_config = ConfigDict(extra="forbid")

    model: str  # catalog id, name or alias of a chat or completion model
    text: str | None = None  # the prefix as text (tokenized as a /v1/completions prompt)
    token_ids: list[int] | None = None  # the prefix as token ids
    messages: list[ChatMessage] | None = None  # the opening of a chat (e.g. a system message)
    # None: 1 h (at most the tenant's max_ttl_s); past max_ttl_s: 400
    ttl_s: float | None = Field(default=None, gt=0, le=MAX_PREFIX_TTL_S)
    # vLLM's prefix-cache salt: the pin serves requests of the same cache_salt
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)


class PrefixDirectory:
    """Which engines hold pins, to find a pin by id (app.state.prefixes).

    Holds the engines weakly: an unloaded model's engine (and its pins) simply disappear.
    """

    def __init__(self) -> None:
        self._engines: weakref.WeakSet[EnginePrefixes] = weakref.WeakSet()

    def add(self, engine: EnginePrefixes) -> None:
        self._engines.add(engine)

    def engines(self) -> list[EnginePrefixes]:
        return [e for e in list(self._engines) if e.is_alive]

    def find(self, prefix_id: str) -> tuple[EnginePrefixes, PinnedPrefix] | None:
        for engine in self.engines():
            found = engine.get(prefix_id)
            if found is not None:
                return engine, found
        return None


def directory_of(request: Request) -> PrefixDirectory:
    directory: PrefixDirectory = request.app.state.prefixes  # set by api/app.py
    return directory


def engine_prefixes(llm: LLMClient, model: str) -> EnginePrefixes:
    """The pins of an LLM client; 400 naming the feature when its engine declares no pins."""
    if not llm.capabilities.pins:
        message = f"model {model!r} does not support pinned prefixes"
        raise APIError(400, message, param="model", code="unsupported_feature")
    return llm.prefixes


def visible(prefix: PinnedPrefix, principal: Principal) -> bool:
    return principal.is_admin or prefix.owner == principal.tenant


@router.post("/v1/prefixes")
@runs_model
async def create_prefix(body: PrefixRequest, request: Request) -> dict[str, Any]:
    """Pin a prefix through the request path (authorize, route, admit, lease), like any
    generation of one token per prefix token."""
    given = [f for f in ("text", "token_ids", "messages") if getattr(body, f) is not None]
    if len(given) != 1:
        raise APIError(400, "give exactly one of text, token_ids or messages", param="text")
    principal = principal_of(request)
    messages = [m.as_template_message() for m in body.messages or []] or None
    path: RequestPath = request.app.state.request_path
    ticket = ticket_of(request)
    policy = PinPolicy.of(ticket)
    ttl_s = policy.ttl_s(body.ttl_s, default=DEFAULT_PREFIX_TTL_S)
    demand = Demand.generation(
        ticket.gateway.config.rate_limit,
        body_bytes=len(await request.body()),
        max_tokens=1,
        sequences=1,
    )

    async def pin(lease: Lease) -> PinnedPrefix:
        engine = engine_prefixes(lease.llm, body.model)
        token_ids = await _prefix_tokens(lease.llm, body, messages)
        directory_of(request).add(engine)
        return await engine.pin(
            token_ids,
            ttl_s=ttl_s,
            owner=principal.tenant,
            messages=messages,
            cache_salt=policy.cache_salt(body.cache_salt),
            owner_limit_blocks=policy.share_blocks(engine.max_pinned_blocks),
        )

    try:
        served = await path.open_llm(request, body.model, demand, pin)
    except PrefixShareError as exc:
        raise APIError(
            507, str(exc), type="insufficient_storage", code="pin_share_exceeded"
        ) from exc
    except PrefixBudgetError as exc:
        raise APIError(
            507, str(exc), type="insufficient_storage", code="pin_budget_exceeded"
        ) from exc
    except PrefixPinError as exc:
        raise APIError(503, f"pin failed: {exc}", code="pin_failed", retry_after_s=1) from exc
    served.record_tokens(served.value.num_tokens, 0)
    await served.aclose()
    return served.value.describe()


@router.get("/v1/prefixes")
async def list_prefixes(request: Request, model: str | None = None) -> dict[str, Any]:
    """The caller's pins and the budgets of the models it may use (`model`: of that one)."""
    principal = principal_of(request)
    policy = PinPolicy.of(ticket_of(request))
    path: RequestPath = request.app.state.request_path
    wanted = None if model is None else path.names.identities(model)
    data: list[dict[str, object]] = []
    budgets: dict[str, dict[str, int]] = {}
    for engine in directory_of(request).engines():
        if not may_call(request, engine.model):
            continue
        if wanted is not None and not wanted & path.names.identities(engine.model):
            continue
        pins = engine.list()
        share = policy.share_blocks(engine.max_pinned_blocks)
        budgets[engine.model] = {
            "pinned_blocks": engine.num_pinned_blocks(),
            "max_pinned_blocks": engine.max_pinned_blocks,
            "tenant_max_pinned_blocks": engine.max_pinned_blocks if share is None else share,
            "block_size": engine.block_size,
        }
        data += [p.describe() for p in pins if visible(p, principal)]
    return {"object": "list", "data": data, "models": budgets}


@router.get("/v1/prefixes/{prefix_id}")
async def get_prefix(prefix_id: str, request: Request) -> dict[str, Any]:
    _, prefix = _find_visible(request, prefix_id)
    return prefix.describe()


@router.delete("/v1/prefixes/{prefix_id}")
async def delete_prefix(prefix_id: str, request: Request) -> dict[str, Any]:
    engine, prefix = _find_visible(request, prefix_id)
    await engine.unpin(prefix.prefix_id)
    return {"id": prefix.prefix_id, "object": "prefix", "deleted": True}


def _find_visible(request: Request, prefix_id: str) -> tuple[EnginePrefixes, PinnedPrefix]:
    found = directory_of(request).find(prefix_id)
    if found is None or not visible(found[1], principal_of(request)):
        raise APIError(404, f"prefix {prefix_id!r} not found", param="prefix_id")
    return found


def resolve_named_prefix(
    request: Request, llm: LLMClient, prefix_id: str, model: str
) -> PinnedPrefix:
    """The pin a chat/completions request names, on the engine serving it (404 otherwise)."""
    prefix = engine_prefixes(llm, model).get(prefix_id)
    if prefix is None or not visible(prefix, principal_of(request)):
        raise APIError(
            404, f"prefix {prefix_id!r} not found for model {model!r}", param="prefix_id"
        )
    return prefix


async def _prefix_tokens(
    llm: LLMClient, body: PrefixRequest, messages: list[dict[str, str]] | None
) -> list[int]:
    if body.token_ids is not None:
        _check_vocab(llm, body.token_ids)
        return list(body.token_ids)
    if messages is not None:
        return await asyncio.to_thread(chat_prefix_tokens, llm, messages)
    text = body.text or ""  # tokenized as /v1/completions tokenizes a prompt
    if len(text) > _INLINE_TOKENIZE_CHARS:
        return await asyncio.to_thread(llm.tokenizer.encode, text)
    return llm.tokenizer.encode(text)


def chat_prefix_tokens(llm: LLMClient, messages: Sequence[dict[str, str]]) -> list[int]:
    """The tokens every conversation opening with `messages` starts with: the common prefix of
    two renderings that continue them differently (robust to templates whose last rendered
    tokens depend on what follows). Blocking: call it in a thread."""
    first = llm.apply_chat_template([*messages, {"role": "user", "content": "A?"}])
    second = llm.apply_chat_template([*messages, {"role": "user", "content": "Z!"}])
    common = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        common += 1
    return first[:common]


def _check_vocab(llm: LLMClient, token_ids: Sequence[int]) -> None:
    size = len(cast(Any, llm.tokenizer))
    bad = [t for t in token_ids if not 0 <= t < size]
    if bad:
        raise APIError(
            400, f"token ids out of the vocabulary (0..{size - 1}): {bad[:5]}", param="token_ids"
        )
