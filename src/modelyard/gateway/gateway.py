"""Assembling the gateway's parts from a `GatewayConfig`, and the exposure check for `serve`.

`auth: auto` turns authentication on as soon as JWT or tenants are configured or the key store
holds an active key; it stays off only for a dev server with nothing configured. Binding such a
server to a non-loopback address is refused unless explicitly allowed (`--allow-insecure` /
`allow_insecure_bind`), and then it warns.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass

from modelyard.gateway.auth import Authenticator, KeyLookup
from modelyard.gateway.config import GatewayConfig
from modelyard.gateway.jwt_auth import JwtVerifier
from modelyard.gateway.keys import KeyStore, RedisKeyStore, SqliteKeyStore
from modelyard.gateway.ratelimit import MemoryStore, RateLimitStore
from modelyard.gateway.usage import UsageTracker

log = logging.getLogger("modelyard.gateway")


@dataclass(slots=True)
class Gateway:
    """The parts the middlewares and admin routes share (one per app)."""

    config: GatewayConfig  # the gateway section
    authenticator: Authenticator  # credentials -> Identity
    limits: RateLimitStore  # memory or Redis buckets
    usage: UsageTracker  # per-tenant totals of this process

    async def close(self) -> None:
        await self.limits.close()


def open_key_store(config: GatewayConfig, sqlite_path: str | None = None) -> KeyStore:
    """The configured key store (a `--db` path overrides the configured SQLite file)."""
    if config.keys.backend == "redis" and sqlite_path is None:
        return RedisKeyStore(config.redis_url or "", timeout_s=max(1.0, config.redis_timeout_s))
    return SqliteKeyStore(sqlite_path or config.keys.sqlite_path)


def auth_enabled(config: GatewayConfig, key_store: KeyStore | None = None) -> bool:
    """Whether requests must authenticate (may read the key store: call at startup)."""
    if config.auth != "auto":
        return config.auth == "on"
    if config.jwt is not None or config.tenants:
        return True
    store = key_store if key_store is not None else open_key_store(config)
    return store.has_keys()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: assume it is reachable from outside


def check_exposure(
    host: str,
    config: GatewayConfig,
    *,
    allow_insecure: bool = False,
    key_store: KeyStore | None = None,
) -> None:
    """Refuse (ValueError) a non-loopback bind without auth unless allowed; warn when allowed."""
    if _is_loopback(host) or auth_enabled(config, key_store):
        return
    if not (allow_insecure or config.allow_insecure_bind):
        raise ValueError(
            f"refusing to serve on {host} without authentication: create a key "
            "(`modelyard keys create`), configure gateway.jwt, or pass --allow-insecure"
        )
    log.warning("serving on %s WITHOUT authentication: anyone who can reach it may use it", host)


def build_limit_store(config: GatewayConfig) -> RateLimitStore:
    if config.rate_limit.store == "memory":
        return MemoryStore()
    from modelyard.gateway.redis_store import RedisStore, make_client

    client = make_client(config.redis_url or "", config.redis_timeout_s)
    return RedisStore(
        client,
        timeout_s=config.redis_timeout_s,
        concurrency_ttl_s=config.rate_limit.concurrency_ttl_s,
    )


def build_gateway(
    config: GatewayConfig,
    *,
    key_store: KeyStore | None = None,
    limits: RateLimitStore | None = None,
    jwt: JwtVerifier | None = None,
    usage: UsageTracker | None = None,
    auth: bool | None = None,
) -> Gateway:
    """All parts from the config; each can be replaced (tests, benchmarks)."""
    store = key_store if key_store is not None else open_key_store(config)
    verifier = jwt if jwt is not None else (JwtVerifier(config.jwt) if config.jwt else None)
    enabled = auth if auth is not None else auth_enabled(config, store)
    authenticator = Authenticator(
        config, enabled=enabled, keys=KeyLookup(store, config.keys.cache_ttl_s), jwt=verifier
    )
    return Gateway(
        config=config,
        authenticator=authenticator,
        limits=limits if limits is not None else build_limit_store(config),
        usage=usage if usage is not None else UsageTracker(),
    )
