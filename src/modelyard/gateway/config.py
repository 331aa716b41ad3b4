"""The `gateway:` section of the server config: auth, tenants, rate limits, routes.

```yaml
gateway:
  auth: auto                       # auto | on | off
  redis_url: redis://127.0.0.1:6379/0
  keys: {backend: sqlite, sqlite_path: /var/lib/modelyard/keys.db}
  jwt: {jwks_file: jwks.json, audience: modelyard, issuer: https://idp, tenant_claim: org,
        scope_claim: scope, admin_scope: admin}
  tenants:
    acme: {models: [chat], priority: 1, rpm: 600, tpm: 100000, ipm: 6000, max_concurrent: 8,
           admin: false, pins: {share: 0.25}}
  pins: {share: 0.5, max_ttl_s: 86400, salt_by_tenant: false}
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

Every class is a frozen, keyword-only dataclass read by `config_parse.from_mapping` (through
`GatewayConfig.from_dict` or the server's `ModelyardConfig`), which raises ValueError on anything
it does not understand (unknown keys included), so a typo in the YAML fails at startup, not at
the first request. A tenant's quota keys sit in its own mapping; `rate_limit.default` is the
default quota. `pins` (pinned prefixes and prefix-cache sharing, api/routes/prefixes.py) is set
for every tenant and may be overridden per tenant, field by field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from modelyard.config_parse import check_fields, from_mapping, setting

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
    "/ui",  # the web console's page and files (api/routes/console.py); its data calls are not
    "/ui/",
    "/ui/static/*",  # a trailing "*": every path that starts with what comes before it
)

INFER_SCOPE = "infer"  # may run the models on its allow-list
ADMIN_SCOPE = "admin"  # may also control models (repository load/unload), /admin/*, /metrics


@dataclass(frozen=True, kw_only=True)
class Quota:
    """Per-tenant limits; None means unlimited."""

    rpm: int | None = setting(None, ge=1)  # requests per minute (token bucket, burst = rpm)
    tpm: int | None = setting(None, ge=1)  # prompt + completion tokens per minute (generation)
    ipm: int | None = setting(None, ge=1)  # inputs per minute (/predict, /v1/embeddings, /v2)
    max_concurrent: int | None = setting(None, ge=1)  # requests in flight at once, every route

    def __post_init__(self) -> None:
        check_fields(self)

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


#: Longest TTL a pin may have whatever the config says (the engine's own limit).
MAX_PIN_TTL_S = 7 * 24 * 3600.0


@dataclass(frozen=True, kw_only=True)
class PinsConfig:
    """What one tenant may do with pinned prefixes and the prefix cache (gateway/pin_policy.py)."""

    # fraction of each model's pin budget (KV blocks) one tenant's pins may hold together
    share: float = setting(0.5, gt=0, le=1)
    # longest TTL a pin may ask for (a longer one is a 400 naming this limit)
    max_ttl_s: float = setting(24 * 3600.0, gt=0, le=MAX_PIN_TTL_S)
    # salt the tenant's prefix-cache hashes with its id: no KV shared with other tenants
    salt_by_tenant: bool = False

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class TenantPins:
    """A tenant's overrides of `gateway.pins` (None: the gateway's value)."""

    share: float | None = setting(None, gt=0, le=1)  # PinsConfig.share
    max_ttl_s: float | None = setting(None, gt=0, le=MAX_PIN_TTL_S)  # PinsConfig.max_ttl_s
    salt_by_tenant: bool | None = None  # PinsConfig.salt_by_tenant

    def __post_init__(self) -> None:
        check_fields(self)

    def over(self, base: PinsConfig) -> PinsConfig:
        """`base` with this tenant's set fields winning."""
        return PinsConfig(
            share=base.share if self.share is None else self.share,
            max_ttl_s=base.max_ttl_s if self.max_ttl_s is None else self.max_ttl_s,
            salt_by_tenant=(
                base.salt_by_tenant if self.salt_by_tenant is None else self.salt_by_tenant
            ),
        )


@dataclass(frozen=True, kw_only=True)
class TenantConfig:
    """A tenant's settings; API keys may override them per key."""

    name: str  # tenant id, as in keys and in the JWT tenant claim
    models: frozenset[str] | None = None  # allowed model names; None: all
    priority: int = 0  # scheduler priority class (higher first)
    quota: Quota = setting(factory=Quota, inline=True)  # limits shared by the tenant's callers
    admin: bool = False  # every caller of the tenant holds the admin scope
    pins: TenantPins = setting(factory=TenantPins)  # overrides of gateway.pins


@dataclass(frozen=True, kw_only=True)
class JwtConfig:
    """JWT bearer tokens verified against a JWKS."""

    jwks_file: str | None = None  # path of a JWKS JSON file
    jwks_url: str | None = None  # or an URL serving it
    audience: str | None = None  # required `aud`; None: not checked
    issuer: str | None = None  # required `iss`; None: not checked
    algorithms: tuple[str, ...] = ("RS256", "ES256")  # accepted signature algorithms
    leeway_s: float = setting(30.0, ge=0)  # clock skew allowed on exp / nbf / iat
    tenant_claim: str = "tenant"  # claim holding the tenant id
    scope_claim: str = "scope"  # claim holding scopes: a space-separated string or a list
    admin_scope: str = ADMIN_SCOPE  # the value in scope_claim that grants the admin scope
    # at most one JWKS refresh per interval (unknown kid)
    refresh_min_interval_s: float = setting(30.0, ge=0)
    # refetch the JWKS after this age even without an unknown kid
    cache_ttl_s: float = setting(3600.0, gt=0)

    def __post_init__(self) -> None:
        check_fields(self)
        if (self.jwks_file is None) == (self.jwks_url is None):
            raise ValueError("set exactly one of jwks_file, jwks_url")
        allowed = {"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256"}
        if not self.algorithms or set(self.algorithms) - allowed:
            raise ValueError(f"algorithms must be asymmetric ones from {sorted(allowed)}")


@dataclass(frozen=True, kw_only=True)
class KeyStoreConfig:
    """Where hashed API keys live."""

    backend: KeyBackend = "sqlite"  # sqlite file (default) or redis (GatewayConfig.redis_url)
    sqlite_path: str = "~/.modelyard/keys.db"  # the SQLite file
    # a revoked key may work this long in a running server; 0: no cache
    cache_ttl_s: float = setting(2.0, ge=0)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class RateLimitConfig:
    """How quotas are counted."""

    store: StoreKind = "memory"  # memory: this process only; redis: shared by all replicas
    on_store_error: FailPolicy = "open"  # redis unreachable: open = allow, closed = 503
    # for tenants without their own (YAML key `default`)
    default_quota: Quota = setting(factory=Quota, key="default")
    chars_per_token: float = setting(4.0, gt=0)  # prompt estimate = body bytes / chars_per_token
    # completion estimate when a generation body has no max_tokens
    default_max_tokens: int = setting(256, ge=0)
    # a crashed replica's in-flight slots expire after this
    concurrency_ttl_s: float = setting(600.0, gt=0)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class ModelRoute:
    """One public model name and where its requests go."""

    name: str  # the public name clients send
    target: str = ""  # the stable model id ("" = the name)
    aliases: tuple[str, ...] = ()  # other names that mean this route
    canary: tuple[tuple[str, float], ...] = ()  # (model id, share in [0, 1]) drawn per request
    fallbacks: tuple[str, ...] = ()  # tried in order when the chosen target fails
    tenants: Mapping[str, str] = setting(factory=dict)  # tenant -> model id (no canary hit)

    def __post_init__(self) -> None:
        if not self.target:
            object.__setattr__(self, "target", self.name)
        total = sum(share for _, share in self.canary)
        if any(share < 0 for _, share in self.canary) or total > 1.0:
            raise ValueError("canary shares must be >= 0 and sum to <= 1")


@dataclass(frozen=True, kw_only=True)
class RoutesConfig:
    """The routing table."""

    models: tuple[ModelRoute, ...] = ()  # routes by public name (YAML: a mapping by name)
    seed: int | None = None  # RNG seed for canary draws (tests, reproducible benchmarks)
    failure_cooldown_s: float = 30.0  # a target reported failing goes last for this long

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for route in self.models:
            for name in (route.name, *route.aliases):
                if name in seen:
                    raise ValueError(f"name or alias {name!r} defined twice")
                seen.add(name)


@dataclass(frozen=True, kw_only=True)
class GatewayConfig:
    """Everything the gateway middleware, router and key CLI need."""

    auth: AuthMode = "auto"  # auto: on when keys exist, JWT or tenants are configured
    allow_insecure_bind: bool = False  # permit a non-loopback bind with auth off (warns)
    open_paths: tuple[str, ...] = DEFAULT_OPEN_PATHS  # never authenticated nor limited
    redis_url: str | None = None  # shared by the redis key store and the redis limit store
    # socket connect/read timeout: a dead Redis never hangs
    redis_timeout_s: float = setting(0.25, gt=0)
    keys: KeyStoreConfig = setting(factory=KeyStoreConfig)
    jwt: JwtConfig | None = None
    tenants: Mapping[str, TenantConfig] = setting(factory=dict)  # by tenant id
    rate_limit: RateLimitConfig = setting(factory=RateLimitConfig)
    routes: RoutesConfig = setting(factory=RoutesConfig)
    pins: PinsConfig = setting(factory=PinsConfig)  # pinned prefixes, for every tenant

    def __post_init__(self) -> None:
        check_fields(self)
        uses_redis = self.rate_limit.store == "redis" or self.keys.backend == "redis"
        if uses_redis and not self.redis_url:
            raise ValueError("redis_url is required by a redis key or rate-limit store")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> GatewayConfig:
        """Build from the parsed YAML `gateway:` section; raises ValueError when invalid."""
        return from_mapping(cls, data, "gateway")

    def pins_of(self, tenant: str) -> PinsConfig:
        """The pin settings of `tenant`: its overrides over `pins`."""
        config = self.tenants.get(tenant)
        return self.pins if config is None else config.pins.over(self.pins)
