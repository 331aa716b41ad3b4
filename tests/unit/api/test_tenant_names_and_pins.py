"""Allow-lists by every name, pins between tenants, cache salts and cached-token usage, through
the real routes and gateway over fake models (auth on)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from api_helpers import make_client, path_app
from test_prefixes_api import PinLLM

from fakes.models import CatalogProvider, MemoryKeys
from modelyard.api.app import build_app
from modelyard.config import ModelyardConfig
from modelyard.engine.client.protocol import RequestOutput
from modelyard.engine.messages import LoRARequest
from modelyard.engine.sampling_params import SamplingParams
from modelyard.gateway.config import GatewayConfig
from modelyard.gateway.gateway import build_gateway
from modelyard.model_spec import ModelKind, ModelSpec

pytestmark = pytest.mark.unit

CHAT = "smollm2-135m-instruct"  # server.textbook.model's default
SPECS = [
    ModelSpec(
        id=CHAT,
        name="SmolLM2-135M-Instruct",
        aliases=("smollm2", "default-chat"),
        kind=ModelKind.CHAT,
        backend="llm",
    ),
    ModelSpec(id="other", kind=ModelKind.CHAT, backend="llm"),
]
GATEWAY = {
    "pins": {"max_ttl_s": 600},
    "tenants": {"salty": {"pins": {"salt_by_tenant": True}}},
}


@dataclass
class CachingLLM(PinLLM):
    """PinLLM whose outputs report 3 prompt tokens served from the prefix cache."""

    def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str,
        *,
        priority: int = 0,
        lora: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        async def outputs() -> AsyncIterator[RequestOutput]:
            async for output in super(CachingLLM, self).generate(
                prompt, params, request_id, priority=priority, lora=lora
            ):
                yield dataclasses.replace(output, num_cached_tokens=3)

        return outputs()


@dataclass
class Env:
    client: httpx.AsyncClient
    keys: MemoryKeys
    chat: CachingLLM
    other: PinLLM


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    provider, keys = CatalogProvider(SPECS), MemoryKeys()
    chat, other = CachingLLM(name=CHAT, max_len=64), PinLLM(name="other", max_len=64)
    provider.models.update({CHAT: chat, "other": other})
    async with make_client(path_app(provider, keys, GATEWAY)) as client:
        yield Env(client, keys, chat, other)


def _chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def test_an_alias_on_the_list_allows_every_name_and_the_textbook_routes(env: Env) -> None:
    key = env.keys.bearer("acme", models=("smollm2",))
    for model in (CHAT, "default-chat", "SmolLM2-135M-Instruct", "smollm2"):
        response = await env.client.post("/v1/chat/completions", json=_chat(model), headers=key)
        assert response.status_code == 200, (model, response.text)
    textbook = [
        ("/basic_generate", {"prompt": "Hi", "max_tokens": 2}),
        ("/generate", {"prompts": ["Hi", "Yo"], "max_tokens": 2}),
        ("/generate_stream", {"prompt": "Hi", "max_tokens": 2}),
    ]
    for path, body in textbook:  # the default model, asked for by its id
        response = await env.client.post(path, json=body, headers=key)
        assert response.status_code == 200, (path, response.text)
    refused = await env.client.post("/v1/chat/completions", json=_chat("other"), headers=key)
    assert refused.status_code == 403
    listed = (await env.client.get("/v1/models", headers=key)).json()["data"]
    assert [m["id"] for m in listed] == [CHAT]  # exactly what the key may call
    by_id = env.keys.bearer("acme", models=(CHAT,))  # the reverse direction
    alias = await env.client.post("/v1/chat/completions", json=_chat("smollm2"), headers=by_id)
    assert alias.status_code == 200, alias.text


async def test_generate_vllm_asks_the_allow_list_for_the_textbook_model() -> None:
    class EchoVLLM:
        async def generate(self, prompts: list[str], params: object) -> list[str]:
            return list(prompts)

    provider, keys = CatalogProvider(SPECS), MemoryKeys()
    config = ModelyardConfig(gateway=GatewayConfig.from_dict({}))
    parts = build_gateway(config.gateway, key_store=keys, auth=True)
    app = build_app(provider, config, gateway=parts, vllm=EchoVLLM())  # type: ignore[arg-type]
    body = {"prompts": ["Hi"], "max_tokens": 2}
    async with make_client(app) as client:
        for models in (("smollm2",), (CHAT,)):
            allowed = keys.bearer("acme", models=models)
            response = await client.post("/generate_vllm", json=body, headers=allowed)
            assert response.status_code == 200, (models, response.text)
        other = keys.bearer("acme", models=("other",))
        refused = await client.post("/generate_vllm", json=body, headers=other)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "model_not_allowed"


async def test_a_tenant_pins_at_most_its_share_and_ttl(env: Env) -> None:
    first, second = env.keys.bearer("acme"), env.keys.bearer("globex")
    pin = {"model": "smollm2", "text": "abcd" * 3}  # 3 blocks: the tenant's share of 6
    assert (await env.client.post("/v1/prefixes", json=pin, headers=first)).status_code == 200
    more = {"model": "smollm2", "text": "wxyz"}
    refused = await env.client.post("/v1/prefixes", json=more, headers=first)
    assert refused.status_code == 507, refused.text
    assert refused.json()["error"]["code"] == "pin_share_exceeded"
    assert (await env.client.post("/v1/prefixes", json=more, headers=second)).status_code == 200
    long = await env.client.post("/v1/prefixes", json={**more, "ttl_s": 601}, headers=second)
    assert long.status_code == 400
    assert long.json()["error"]["param"] == "ttl_s"
    assert "600" in long.json()["error"]["message"]
    default = await env.client.post("/v1/prefixes", json={**more, "text": "q" * 4}, headers=second)
    assert default.json()["ttl_s"] == 600  # 1 h by default, shortened to the tenant's limit
    listing = (await env.client.get("/v1/prefixes", headers=first)).json()
    assert listing["models"][CHAT]["tenant_max_pinned_blocks"] == 3


async def test_prefixes_list_only_the_budgets_of_allowed_models(env: Env) -> None:
    ops = env.keys.bearer("ops")
    for model in (CHAT, "other"):
        pinned = await env.client.post(
            "/v1/prefixes", json={"model": model, "text": "abcd"}, headers=ops
        )
        assert pinned.status_code == 200, pinned.text
    narrow = env.keys.bearer("acme", models=("default-chat",))
    listing = (await env.client.get("/v1/prefixes", headers=narrow)).json()
    assert set(listing["models"]) == {CHAT}
    assert listing["data"] == []  # another tenant's pins stay hidden
    by_alias = await env.client.get("/v1/prefixes?model=smollm2", headers=ops)
    assert set(by_alias.json()["models"]) == {CHAT}


async def test_cache_salt_reaches_the_engine_composed_with_the_tenant(env: Env) -> None:
    plain, salty = env.keys.bearer("acme"), env.keys.bearer("salty")
    for body, key in (
        (_chat(CHAT), plain),
        ({**_chat(CHAT), "cache_salt": "s1"}, plain),
        (_chat(CHAT), salty),
        ({"model": CHAT, "prompt": "Hi", "max_tokens": 2, "cache_salt": "s1"}, salty),
    ):
        path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
        response = await env.client.post(path, json=body, headers=key)
        assert response.status_code == 200, response.text
    await env.client.post("/basic_generate", json={"prompt": "Hi", "max_tokens": 2}, headers=salty)
    salts = [call.params.cache_salt for call in env.chat.calls]
    assert salts[0] is None  # no salt: shared, as before
    assert len(set(salts)) == 4  # s1, the tenant's, the tenant's with s1: all different
    assert salts[4] == salts[2]  # the textbook route carries the tenant's salt too
    assert "salty" in (salts[2] or "")
    assert "s1" in (salts[3] or "")
    pinned = await env.client.post(
        "/v1/prefixes", json={"model": CHAT, "text": "abcd", "cache_salt": "s1"}, headers=salty
    )
    assert pinned.status_code == 200, pinned.text
    assert env.chat.transport.pins[-1].cache_salt == salts[3]  # the pin serves the same salt
    empty = await env.client.post(
        "/v1/chat/completions", json={**_chat(CHAT), "cache_salt": ""}, headers=plain
    )
    assert empty.status_code == 400


async def test_usage_reports_cached_tokens_the_openai_way(env: Env) -> None:
    key = env.keys.bearer("acme")
    chat = (await env.client.post("/v1/chat/completions", json=_chat(CHAT), headers=key)).json()
    assert chat["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}
    assert chat["modelyard"]["cached_tokens"] == 3  # the existing field stays
    body = {"model": CHAT, "prompt": "Hi", "max_tokens": 2, "n": 2}
    completion = (await env.client.post("/v1/completions", json=body, headers=key)).json()
    assert completion["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}
    stream = {**_chat(CHAT), "stream": True, "stream_options": {"include_usage": True}}
    response = await env.client.post("/v1/chat/completions", json=stream, headers=key)
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: {")]
    usage = json.loads(events[-1])["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 3}
