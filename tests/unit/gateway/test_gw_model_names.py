"""Allow-lists by every name (gateway/model_names.py) and the tenant pin policy
(gateway/pin_policy.py, the `pins` config): pure functions, no app."""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelyard.config_parse import ConfigError
from modelyard.engine.block_hashes import prefix_cache_salt
from modelyard.engine.client.prefixes import MAX_PREFIX_TTL_S
from modelyard.gateway.base import ANONYMOUS, Principal
from modelyard.gateway.config import MAX_PIN_TTL_S, GatewayConfig, PinsConfig
from modelyard.gateway.errors import GatewayError
from modelyard.gateway.model_names import ModelNames
from modelyard.gateway.pin_policy import PinPolicy
from modelyard.gateway.router import build_router
from modelyard.manager.base import ModelNotFoundError
from modelyard.model_spec import ModelKind, ModelSpec

pytestmark = pytest.mark.unit

CHAT = ModelSpec(
    id="smollm2-135m-instruct",
    name="SmolLM2-135M-Instruct",
    aliases=("smollm2", "default-chat"),
    kind=ModelKind.CHAT,
    backend="llm",
)
OTHER = ModelSpec(id="qwen", aliases=("qwen-small",), kind=ModelKind.CHAT, backend="llm")
# a LoRA adapter's entry, as manager/adapters.py's adapter_spec makes it: its base under its name
ADAPTER = ModelSpec(id="finance", name="finance", kind=ModelKind.CHAT, backend="llm")


def _spec_of(name: str) -> ModelSpec:
    for spec in (CHAT, OTHER, ADAPTER):
        if name in spec.names:
            return spec
    raise ModelNotFoundError(name)


def _names() -> ModelNames:
    gateway = GatewayConfig.from_dict(
        {"routes": {"models": {"chat": {"target": "qwen", "aliases": ["gpt-4o-mini"]}}}}
    )
    return ModelNames(build_router(gateway), _spec_of)


def _key(*models: str) -> Principal:
    return Principal(tenant="acme", allowed_models=frozenset(models))


@pytest.mark.parametrize("entry", CHAT.names)
def test_an_entry_allows_every_name_of_its_model(entry: str) -> None:
    names = _names()
    for name in CHAT.names:
        assert names.allows(_key(entry), name), (entry, name)
    assert not names.allows(_key(entry), "qwen")
    assert not names.allows(_key(entry), "finance")
    assert not names.allows(_key(entry), "chat")


def test_routes_adapters_and_unknown_names_are_their_own_models() -> None:
    names = _names()
    assert names.allows(_key("gpt-4o-mini"), "chat")  # a route alias names the route
    assert names.allows(_key("chat"), "gpt-4o-mini")
    assert not names.allows(_key("chat"), "qwen")  # the route's target is another model
    assert names.allows(_key("finance"), "finance")
    assert not names.allows(_key("smollm2"), "finance")  # an adapter is a model of its own
    assert names.allows(_key("nope"), "nope")  # unknown: itself (then 404)
    assert not names.allows(_key("nope"), "other")
    assert names.identities("default-chat") == {"smollm2-135m-instruct"}
    assert names.allows(ANONYMOUS, "anything")


def test_pins_config_defaults_limits_and_tenant_overrides() -> None:
    config = GatewayConfig.from_dict(
        {"pins": {"max_ttl_s": 600}, "tenants": {"acme": {"pins": {"share": 0.25}}}}
    )
    assert config.pins == PinsConfig(share=0.5, max_ttl_s=600.0, salt_by_tenant=False)
    assert config.pins_of("acme") == PinsConfig(share=0.25, max_ttl_s=600.0)
    assert config.pins_of("key-only-tenant") == config.pins
    assert MAX_PIN_TTL_S == MAX_PREFIX_TTL_S  # the gateway's bound is the engine's
    bad: list[tuple[dict[str, Any], str]] = [
        ({"pins": {"share": 0}}, "gateway.pins.share: must be > 0"),
        ({"pins": {"share": 1.5}}, "gateway.pins.share: must be <= 1"),
        ({"pins": {"max_ttl_s": 8 * 86400}}, "gateway.pins.max_ttl_s: must be <="),
        ({"tenants": {"acme": {"pins": {"shar": 1}}}}, "gateway.tenants.acme.pins: unknown"),
    ]
    for data, message in bad:
        with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
            GatewayConfig.from_dict(data)


def test_share_and_ttl_policy() -> None:
    policy = PinPolicy(tenant="acme", config=PinsConfig(share=0.5, max_ttl_s=600))
    assert policy.share_blocks(364) == 182
    assert (
        PinPolicy(tenant="anonymous", config=PinsConfig(), whole_budget=True).share_blocks(9)
        is None
    )
    assert policy.ttl_s(None, default=3600) == 600  # the default, shortened to the limit
    assert policy.ttl_s(600, default=3600) == 600
    with pytest.raises(GatewayError) as refused:
        policy.ttl_s(601, default=3600)
    assert (refused.value.status, refused.value.param) == (400, "ttl_s")
    assert "at most 600 seconds" in refused.value.message


def test_cache_salt_by_request_and_by_tenant() -> None:
    shared = PinPolicy(tenant="acme", config=PinsConfig())
    salted = PinPolicy(tenant="acme", config=PinsConfig(salt_by_tenant=True))
    assert shared.cache_salt(None) is None  # unsalted: shared with everyone
    assert shared.cache_salt("a") != shared.cache_salt("b")
    assert salted.cache_salt(None) != PinPolicy("globex", salted.config).cache_salt(None)
    assert salted.cache_salt("a") != salted.cache_salt(None)
    # no cache_salt a client sends reproduces a salted tenant's salt
    forged = json.loads(salted.cache_salt(None) or "")
    assert shared.cache_salt(json.dumps(forged)) != salted.cache_salt(None)
    assert shared.cache_salt('"],["tenant","acme') != salted.cache_salt(None)


def test_engine_salt_keeps_adapter_hashes_and_separates_salts() -> None:
    assert prefix_cache_salt(None, None) is None
    assert prefix_cache_salt(None, "a") != prefix_cache_salt(None, "b")
    assert prefix_cache_salt(None, "a") is not None
