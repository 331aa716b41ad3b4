"""The `gateway:` section of the server config: auth, tenants, rate limits, routes.

Every class is a frozen, keyword-only dataclass; `GatewayConfig.from_dict` is the one loader and
raises ValueError on anything it does not understand (unknown keys included), so a typo in the YAML
fails at startup, not at the first request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

AuthMode = Literal["auto", "on", "off"]
StoreKind = Literal["memory", "redis"]
KeyBackend = Literal["sqlite", "redis"]
FailPolicy = Literal["open", "closed"]

# Never authenticated nor limited. `/metrics` is not among them: with auth on it needs an admin
# credential unless the operator lists it here (e.g. for a scraper on a private network).
DEFAULT_OPEN_PATHS = (
    "/health",
    "/healthz",
    "/ready",
    "/v2/health/live",
    "/v2/health/ready",
)

INFER_SCOPE = "infer"  # may run the models on its allow-list
ADMIN_SCOPE = "admin"  # may also control models (repository load/unload), /admin/*, /metrics


@dataclass(frozen=True, kw_only=True)
class Quota:
    """Per-tenant limits; None means unlimited."""

    rpm: int | None = None  # requests per minute (token bucket, burst = rpm), every route
    tpm: int | None = None  # prompt + completion tokens per minute (generation routes)
    ipm: int | None = None  # inputs per minute (/predict, /v1/embeddings, /v2 infer)
    max_concurrent: int | None = None  # requests in flight at once, every route

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm", "ipm", "max_concurrent"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"quota {name} must be a positive integer, got {value!r}")

    @property
    def unlimited(self) -> bool:
        return (
            self.rpm is None
            and self.tpm is None
            and self.ipm is None
            and (self.max_concurrent is None)
        )

    def overridden_by(self, other: Quota) -> Quota:
        """`other`'s set fields win over this quota's."""
        return Quota(
            rpm=other.rpm if other.rpm is not None else self.rpm,
            tpm=other.tpm if other.tpm is not None else self.tpm,
            ipm=other.ipm if other.ipm is not None else self.ipm,
            max_concurrent=(
                other.max_concurrent if other.max_concurrent is not None else self.max_concurrent
            ),
        )


@dataclass(frozen=True, kw_only=True)
class TenantConfig:
    """A tenant's settings; API keys may override them per key."""

    name: str  # tenant id, as in keys and in the JWT tenant claim
    models: frozenset[str] | None = None  # allowed model names; None: all
    priority: int = 0  # scheduler priority class (higher first)
    quota: Quota = field(default_factory=Quota)  # limits shared by all the tenant's callers
    admin: bool = False  # every caller of the tenant holds the admin scope


@dataclass(frozen=True, kw_only=True)
class JwtConfig:
    """JWT bearer tokens verified against a JWKS."""

    jwks_file: str | None = None  # path of a JWKS JSON file
    jwks_url: str | None = None  # or an URL serving it
    audience: str | None = None  # required `aud`; None: not checked
    issuer: str | None = None  # required `iss`; None: not checked
    algorithms: tuple[str, ...] = ("RS256", "ES256")  # accepted signature algorithms
    leeway_s: float = 30.0  # clock skew allowed on exp / nbf / iat
    tenant_claim: str = "tenant"  # claim holding the tenant id
    scope_claim: str = "scope"  # claim holding scopes: a space-separated string or a list
    admin_scope: str = ADMIN_SCOPE  # the value in scope_claim that grants the admin scope
    refresh_min_interval_s: float = 30.0  # at most one JWKS refresh per interval (unknown kid)
    cache_ttl_s: float = 3600.0  # refetch the JWKS after this age even without an unknown kid

    def __post_init__(self) -> None:
        if (self.jwks_file is None) == (self.jwks_url is None):
            raise ValueError("jwt: set exactly one of jwks_file, jwks_url")
        allowed = {"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256"}
        if not self.algorithms or set(self.algorithms) - allowed:
            raise ValueError(f"jwt.algorithms must be asymmetric algorithms from {sorted(allowed)}")
        if self.leeway_s < 0 or self.refresh_min_interval_s < 0 or self.cache_ttl_s <= 0:
            raise ValueError("jwt: leeway_s/refresh_min_interval_s >= 0 and cache_ttl_s > 0")


@dataclass(frozen=True, kw_only=True)
class KeyStoreConfig:
    """Where hashed API keys live."""

    backend: KeyBackend = "sqlite"  # sqlite file (default) or redis (GatewayConfig.redis_url)
    sqlite_path: str = "~/.modelyard/keys.db"  # the SQLite file
    cache_ttl_s: float = 2.0  # a revoked key may work this long in a running server; 0: no cache

    def __post_init__(self) -> None:
        if self.backend not in ("sqlite", "redis"):
            raise ValueError(f"keys.backend must be sqlite or redis, got {self.backend!r}")
        if self.cache_ttl_s < 0:
            raise ValueError("keys.cache_ttl_s must be >= 0")


@dataclass(frozen=True, kw_only=True)
class RateLimitConfig:
    """How quotas are counted."""

    store: StoreKind = "memory"  # memory: this process only; redis: shared by all replicas
    on_store_error: FailPolicy = "open"  # redis unreachable: open = allow, closed = 503
    default_quota: Quota = field(default_factory=Quota)  # for tenants without their own
    chars_per_token: float = 4.0  # prompt estimate = body bytes / chars_per_token
    default_max_tokens: int = 256  # completion estimate when a generation body has no max_tokens
    concurrency_ttl_s: float = 600.0  # a crashed replica's in-flight slots expire after this

    def __post_init__(self) -> None:
        if self.store not in ("memory", "redis"):
            raise ValueError(f"rate_limit.store must be memory or redis, got {self.store!r}")
        if self.on_store_error not in ("open", "closed"):
            raise ValueError("rate_limit.on_store_error must be open or closed")
        if self.chars_per_token <= 0 or self.default_max_tokens < 0 or self.concurrency_ttl_s <= 0:
            raise ValueError("rate_limit: chars_per_token > 0, default_max_tokens >= 0")


@dataclass(frozen=True, kw_only=True)
class ModelRoute:
    """One public model name and where its requests go."""

    name: str  # the public name clients send
    target: str  # the stable model id (defaults to the name)
    aliases: tuple[str, ...] = ()  # other names that mean this route
    canary: tuple[tuple[str, float], ...] = ()  # (model id, share in [0, 1]) drawn per request
    fallbacks: tuple[str, ...] = ()  # tried in order when the chosen target fails
    tenants: Mapping[str, str] = field(default_factory=dict)  # tenant -> model id (no canary hit)

    def __post_init__(self) -> None:
        total = sum(share for _, share in self.canary)
        if any(share < 0 for _, share in self.canary) or total > 1.0:
            raise ValueError(f"route {self.name}: canary shares must be >= 0 and sum to <= 1")


@dataclass(frozen=True, kw_only=True)
class RoutesConfig:
    """The routing table."""

    models: tuple[ModelRoute, ...] = ()  # routes by public name
    seed: int | None = None  # RNG seed for canary draws (tests, reproducible benchmarks)
    failure_cooldown_s: float = 30.0  # a target reported failing goes last for this long

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for route in self.models:
            for name in (route.name, *route.aliases):
                if name in seen:
                    raise ValueError(f"routes: name or alias {name!r} defined twice")
                seen.add(name)


@dataclass(frozen=True, kw_only=True)
class GatewayConfig:
    """Everything the gateway middleware, router and key CLI need."""

    auth: AuthMode = "auto"  # auto: on when keys exist, JWT or tenants are configured
    allow_insecure_bind: bool = False  # permit a non-loopback bind with auth off (warns)
    open_paths: tuple[str, ...] = DEFAULT_OPEN_PATHS  # never authenticated nor limited
    redis_url: str | None = None  # shared by the redis key store and the redis limit store
    redis_timeout_s: float = 0.25  # socket connect/read timeout: a dead Redis never hangs
    keys: KeyStoreConfig = field(default_factory=KeyStoreConfig)
    jwt: JwtConfig | None = None
    tenants: Mapping[str, TenantConfig] = field(default_factory=dict)
    rate_limit: RateLimitConfig = field(default_factory=RateLimitConfig)
    routes: RoutesConfig = field(default_factory=RoutesConfig)

    def __post_init__(self) -> None:
        if self.auth not in ("auto", "on", "off"):
            raise ValueError(f"gateway.auth must be auto, on or off, got {self.auth!r}")
        if self.redis_timeout_s <= 0:
            raise ValueError("gateway: redis_timeout_s must be > 0")
        uses_redis = self.rate_limit.store == "redis" or self.keys.backend == "redis"
        if uses_redis and not self.redis_url:
            raise ValueError("gateway.redis_url is required by a redis key or rate-limit store")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> GatewayConfig:
        """Build from the parsed YAML `gateway:` section; raises ValueError when invalid."""
        from modelyard.gateway.config_loader import load_gateway_config

        return load_gateway_config(data or {})
