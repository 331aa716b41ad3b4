"""The prefix API over fakes: an EnginePrefixes whose transport answers pins at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
from api_helpers import make_client

from fakes.llm import CharTokenizer, FakeLLM
from fakes.models import FakeProvider
from modelyard.api.app import build_app
from modelyard.api.routes.prefixes import PrefixDirectory, visible
from modelyard.config import ModelyardConfig
from modelyard.engine.client.prefixes import EnginePrefixes, PinnedPrefix, PrefixRegistry
from modelyard.engine.client.protocol import EngineCapabilities
from modelyard.engine.messages import (
    EngineOutput,
    EngineRequest,
    FinishReason,
    PinPrefix,
    SchedulerStats,
)
from modelyard.gateway.base import ADMIN_SCOPE, Principal

pytestmark = pytest.mark.unit


class VocabTokenizer(CharTokenizer):
    def __len__(self) -> int:
        return 0x110000


@dataclass
class FakePinTransport:
    fail: str | None = None  # error message of the pin outputs
    alive: bool = True
    pins: list[PinPrefix] = field(default_factory=list)
    unpinned: list[str] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)

    async def add_request(
        self, request: EngineRequest | PinPrefix, queue: object = None
    ) -> AsyncIterator[EngineOutput]:
        assert isinstance(request, PinPrefix)
        self.pins.append(request)
        return self._answer(request.request_id)

    async def _answer(self, request_id: str) -> AsyncIterator[EngineOutput]:
        reason = FinishReason.ERROR if self.fail else FinishReason.LENGTH
        yield EngineOutput(
            request_id=request_id, new_token_ids=[], finish_reason=reason, error=self.fail
        )

    async def abort(self, request_ids: list[str]) -> None:
        return None

    async def unpin_prefixes(self, prefix_ids: list[str]) -> None:
        self.unpinned += prefix_ids

    def stats(self) -> SchedulerStats:
        return SchedulerStats(prefix_hits=dict(self.hits), num_pinned_blocks=len(self.pins))

    @property
    def is_alive(self) -> bool:
        return self.alive


@dataclass
class PinLLM(FakeLLM):
    """A fake engine that declares pins."""

    transport: FakePinTransport = field(default_factory=FakePinTransport)
    capabilities: EngineCapabilities = field(
        default_factory=lambda: EngineCapabilities(lora=True, pins=True)
    )
    pinned: EnginePrefixes = field(init=False)

    def __post_init__(self) -> None:
        registry = PrefixRegistry(
            model=self.name, block_size=4, max_pinned_blocks=6, max_model_len=64
        )
        self.pinned = EnginePrefixes(self.transport, registry)

    @property
    def prefixes(self) -> EnginePrefixes:
        return self.pinned

    @property
    def tokenizer(self) -> VocabTokenizer:
        return VocabTokenizer()


@pytest.fixture
def llm() -> PinLLM:
    return PinLLM(name="m", max_len=64)


@pytest.fixture
def provider(llm: PinLLM) -> FakeProvider:
    return FakeProvider({"m": llm, "plain": FakeLLM(name="plain")})


@pytest.fixture
async def client(provider: FakeProvider) -> AsyncIterator[httpx.AsyncClient]:
    async with make_client(build_app(provider, ModelyardConfig())) as c:
        yield c


async def test_pin_list_get_delete(client: httpx.AsyncClient, llm: PinLLM) -> None:
    response = await client.post("/v1/prefixes", json={"model": "m", "text": "x" * 18})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"].startswith("pfx-")
    assert (body["num_tokens"], body["num_pinned_tokens"], body["num_blocks"]) == (18, 16, 4)
    assert llm.transport.pins[0].token_ids == [ord("x")] * 18
    llm.transport.hits[body["id"]] = 2
    listing = (await client.get("/v1/prefixes")).json()
    assert [p["id"] for p in listing["data"]] == [body["id"]]
    assert listing["data"][0]["hits"] == 2
    assert listing["models"]["m"]["max_pinned_blocks"] == 6
    assert (await client.get(f"/v1/prefixes/{body['id']}")).json()["hits"] == 2
    deleted = await client.delete(f"/v1/prefixes/{body['id']}")
    assert deleted.json() == {"id": body["id"], "object": "prefix", "deleted": True}
    assert llm.transport.unpinned == [body["id"]]
    assert (await client.get(f"/v1/prefixes/{body['id']}")).status_code == 404
    assert (await client.delete(f"/v1/prefixes/{body['id']}")).status_code == 404


@pytest.mark.parametrize(
    "payload",
    [
        {"model": "m"},
        {"model": "m", "text": "abcdabcd", "token_ids": [1, 2, 3, 4]},
        {"model": "m", "text": "ab"},  # shorter than one block
        {"model": "m", "text": "a" * 63},  # no room left for a request
        {"model": "m", "token_ids": [1, 2, 3, -4]},
        {"model": "m", "text": "abcdabcd", "ttl_s": 0},
        {"model": "plain", "text": "abcdabcd"},  # an engine without pins
    ],
)
async def test_bad_pins_are_400(client: httpx.AsyncClient, payload: dict[str, object]) -> None:
    response = await client.post("/v1/prefixes", json=payload)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/prefixes", json={"model": "nope", "text": "abcdabcd"})
    assert response.status_code == 404


async def test_over_budget_is_507_and_shared_blocks_count_once(
    client: httpx.AsyncClient, llm: PinLLM
) -> None:
    first = await client.post("/v1/prefixes", json={"model": "m", "text": "abcd" * 4})
    assert first.status_code == 200  # 4 of 6 blocks
    shared = await client.post("/v1/prefixes", json={"model": "m", "text": "abcd" * 5 + "efgh"})
    assert shared.status_code == 200, shared.text  # 6 blocks, 4 shared: 6 of 6
    refused = await client.post("/v1/prefixes", json={"model": "m", "text": "zzzz"})
    assert refused.status_code == 507
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("insufficient_storage", "pin_budget_exceeded")
    assert len(llm.transport.pins) == 2  # the refused one never reached the engine
    await client.delete(f"/v1/prefixes/{shared.json()['id']}")
    assert (
        await client.post("/v1/prefixes", json={"model": "m", "text": "zzzz"})
    ).status_code == 200


async def test_engine_failure_is_503_and_leaves_no_pin(
    client: httpx.AsyncClient, llm: PinLLM
) -> None:
    llm.transport.fail = "engine error: boom"
    response = await client.post("/v1/prefixes", json={"model": "m", "text": "abcd" * 4})
    assert response.status_code == 503
    assert "boom" in response.json()["error"]["message"]
    assert (await client.get("/v1/prefixes")).json()["data"] == []


async def test_chat_naming_a_message_prefix_starts_with_its_tokens(
    client: httpx.AsyncClient, llm: PinLLM
) -> None:
    system = {"role": "system", "content": "the knowledge"}
    pinned = (await client.post("/v1/prefixes", json={"model": "m", "messages": [system]})).json()
    assert pinned["num_tokens"] == len("system:the knowledge|user:")  # the fake's template
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "q?"}],
        "max_tokens": 2,
        "prefix_id": pinned["id"],
    }
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert llm.calls[-1].prompt == [ord(c) for c in "system:the knowledge|user:q?"]


async def test_completion_naming_a_text_prefix_prepends_its_tokens(
    client: httpx.AsyncClient, llm: PinLLM
) -> None:
    pinned = (await client.post("/v1/prefixes", json={"model": "m", "text": "K" * 9})).json()
    body = {"model": "m", "prompt": "ab", "max_tokens": 2, "prefix_id": pinned["id"]}
    assert (await client.post("/v1/completions", json=body)).status_code == 200
    assert llm.calls[-1].prompt == [ord("K")] * 9 + [ord("a"), ord("b")]


async def test_unknown_or_expired_prefix_id_is_404(client: httpx.AsyncClient) -> None:
    short = await client.post("/v1/prefixes", json={"model": "m", "text": "K" * 8, "ttl_s": 0.05})
    await asyncio.sleep(0.1)
    for prefix_id in ("pfx-nope", short.json()["id"]):
        body = {"model": "m", "prompt": "ab", "max_tokens": 2, "prefix_id": prefix_id}
        response = await client.post("/v1/completions", json=body)
        assert response.status_code == 404
        assert response.json()["error"]["param"] == "prefix_id"
    assert (await client.get("/v1/prefixes")).json()["data"] == []


def test_pins_of_a_dead_engine_disappear() -> None:
    llm = PinLLM(name="m")
    directory = PrefixDirectory()
    directory.add(llm.prefixes)
    assert directory.engines() == [llm.prefixes]
    llm.transport.alive = False
    assert directory.engines() == []


def test_a_pin_is_visible_to_its_tenant_and_admins_only() -> None:
    prefix = PinnedPrefix(
        prefix_id="pfx-1",
        model="m",
        token_ids=[1] * 4,
        messages=None,
        owner="acme",
        num_blocks=1,
        num_pinned_tokens=4,
        ttl_s=9.0,
        created_at=0.0,
        expires_at=9.0,
    )
    assert visible(prefix, Principal(tenant="acme"))
    assert not visible(prefix, Principal(tenant="globex"))
    assert visible(prefix, Principal(tenant="globex", scopes=frozenset({ADMIN_SCOPE})))
