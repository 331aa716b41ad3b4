"""Parse the `gateway:` mapping into `GatewayConfig`; every error is a ValueError.

```yaml
gateway:
  auth: auto                       # auto | on | off
  redis_url: redis://127.0.0.1:6379/0
  keys: {backend: sqlite, sqlite_path: /var/lib/modelyard/keys.db}
  jwt: {jwks_file: jwks.json, audience: modelyard, issuer: https://idp, tenant_claim: org,
        scope_claim: scope, admin_scope: admin}
  tenants:
    acme: {models: [chat], priority: 1, rpm: 600, tpm: 100000, ipm: 6000, max_concurrent: 8,
           admin: false}
  rate_limit: {store: redis, on_store_error: closed, default: {rpm: 60}}
  routes:
    seed: 7
    models:
      chat:
        target: smollm2-135m
        aliases: [gpt-4o-mini]
        canary: {chat-v2: 0.1}
        fallbacks: [qwen2.5-0.5b]
        tenants: {acme: chat-acme}
```
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from modelyard.gateway.config import (
    GatewayConfig,
    JwtConfig,
    KeyStoreConfig,
    ModelRoute,
    Quota,
    RateLimitConfig,
    RoutesConfig,
    TenantConfig,
)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a mapping, got {type(value).__name__}")
    return value


def _check_keys(data: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = set(data) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where} must be a list of strings")
    return tuple(value)


def _quota(data: Mapping[str, Any], where: str) -> Quota:
    try:
        return Quota(
            rpm=data.get("rpm"),
            tpm=data.get("tpm"),
            ipm=data.get("ipm"),
            max_concurrent=data.get("max_concurrent"),
        )
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def _tenant(name: str, raw: Any) -> TenantConfig:
    where = f"gateway.tenants.{name}"
    data = _mapping(raw, where)
    _check_keys(data, {"models", "priority", "rpm", "tpm", "ipm", "max_concurrent", "admin"}, where)
    models = data.get("models")
    priority = data.get("priority", 0)
    if not isinstance(priority, int):
        raise ValueError(f"{where}.priority must be an integer")
    return TenantConfig(
        name=name,
        models=None if models is None else frozenset(_str_list(models, f"{where}.models")),
        priority=priority,
        quota=_quota(data, where),
        admin=bool(data.get("admin", False)),
    )


def _route(name: str, raw: Any) -> ModelRoute:
    where = f"gateway.routes.models.{name}"
    data = _mapping(raw, where)
    _check_keys(data, {"target", "aliases", "canary", "fallbacks", "tenants"}, where)
    canary = _mapping(data.get("canary"), f"{where}.canary")
    shares: list[tuple[str, float]] = []
    for model, share in canary.items():
        if not isinstance(share, int | float):
            raise ValueError(f"{where}.canary.{model} must be a number in [0, 1]")
        shares.append((str(model), float(share)))
    tenants = _mapping(data.get("tenants"), f"{where}.tenants")
    return ModelRoute(
        name=name,
        target=str(data.get("target", name)),
        aliases=_str_list(data.get("aliases"), f"{where}.aliases"),
        canary=tuple(shares),
        fallbacks=_str_list(data.get("fallbacks"), f"{where}.fallbacks"),
        tenants={str(k): str(v) for k, v in tenants.items()},
    )


def _routes(raw: Any) -> RoutesConfig:
    data = _mapping(raw, "gateway.routes")
    _check_keys(data, {"models", "seed", "failure_cooldown_s"}, "gateway.routes")
    models = _mapping(data.get("models"), "gateway.routes.models")
    return RoutesConfig(
        models=tuple(_route(str(n), spec) for n, spec in models.items()),
        seed=data.get("seed"),
        failure_cooldown_s=float(data.get("failure_cooldown_s", 30.0)),
    )


def _rate_limit(raw: Any) -> RateLimitConfig:
    where = "gateway.rate_limit"
    data = dict(_mapping(raw, where))
    allowed = {
        "store",
        "on_store_error",
        "default",
        "chars_per_token",
        "default_max_tokens",
        "concurrency_ttl_s",
    }
    _check_keys(data, allowed, where)
    default = _mapping(data.pop("default", None), f"{where}.default")
    _check_keys(default, {"rpm", "tpm", "ipm", "max_concurrent"}, f"{where}.default")
    return RateLimitConfig(default_quota=_quota(default, f"{where}.default"), **data)


def _jwt(raw: Any) -> JwtConfig | None:
    if raw is None:
        return None
    data = dict(_mapping(raw, "gateway.jwt"))
    allowed = {
        "jwks_file",
        "jwks_url",
        "audience",
        "issuer",
        "algorithms",
        "leeway_s",
        "tenant_claim",
        "scope_claim",
        "admin_scope",
        "refresh_min_interval_s",
        "cache_ttl_s",
    }
    _check_keys(data, allowed, "gateway.jwt")
    if "algorithms" in data:
        data["algorithms"] = _str_list(data["algorithms"], "gateway.jwt.algorithms")
    return JwtConfig(**data)


def load_gateway_config(data: Mapping[str, Any]) -> GatewayConfig:
    """The loader behind `GatewayConfig.from_dict`."""
    data = dict(_mapping(data, "gateway"))
    allowed = {
        "auth",
        "allow_insecure_bind",
        "open_paths",
        "redis_url",
        "redis_timeout_s",
        "keys",
        "jwt",
        "tenants",
        "rate_limit",
        "routes",
    }
    _check_keys(data, allowed, "gateway")
    keys = _mapping(data.pop("keys", None), "gateway.keys")
    _check_keys(keys, {"backend", "sqlite_path", "cache_ttl_s"}, "gateway.keys")
    tenants = _mapping(data.pop("tenants", None), "gateway.tenants")
    if "open_paths" in data:
        data["open_paths"] = _str_list(data["open_paths"], "gateway.open_paths")
    if isinstance(data.get("auth"), bool):  # YAML reads `on`/`off` as booleans
        data["auth"] = "on" if data["auth"] else "off"
    try:
        return GatewayConfig(
            keys=KeyStoreConfig(**keys),
            jwt=_jwt(data.pop("jwt", None)),
            tenants={str(n): _tenant(str(n), t) for n, t in tenants.items()},
            rate_limit=_rate_limit(data.pop("rate_limit", None)),
            routes=_routes(data.pop("routes", None)),
            **data,
        )
    except TypeError as exc:  # a wrong type reaching a dataclass
        raise ValueError(f"gateway config: {exc}") from exc
