"""Helpers of the API tests: an httpx client over an ASGI app, and the real app (routes,
gateway, request path) over fake models and keys."""

from __future__ import annotations

from typing import Any

import httpx

from fakes.models import CatalogProvider, MemoryKeys
from modelyard.api.app import build_app
from modelyard.config import ModelyardConfig
from modelyard.gateway.config import GatewayConfig
from modelyard.gateway.gateway import build_gateway


def make_client(app: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://test")


def path_app(provider: CatalogProvider, keys: MemoryKeys, gateway: dict[str, Any]) -> Any:
    """The real app (routes, gateway, request path) over the fakes, auth on."""
    config = ModelyardConfig(gateway=GatewayConfig.from_dict(gateway))
    parts = build_gateway(config.gateway, key_store=keys, auth=True)
    return build_app(provider, config, gateway=parts)  # type: ignore[arg-type]
