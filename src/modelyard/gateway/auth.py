"""Credentials -> `Principal` + `Quota`.

Credentials are read from `x-api-key: KEY` or `Authorization: Bearer TOKEN`. A bearer token that
starts with `my-` is an API key; anything else is verified as a JWT (when JWT is configured).

- API key: the record's own settings win over the tenant's config, which wins over the defaults.
  A key's tenant need not be listed in the config (the key defines it).
- JWT: the tenant comes from the configured claim and must be listed under `gateway.tenants`
  (otherwise 403 unknown tenant).

Scopes: every principal holds `infer`; `admin` (model control, /admin/*, /metrics) comes from a
key created with `--admin`, a tenant configured `admin: true`, or a JWT whose `scope_claim`
(a space-separated string or a list) contains `admin_scope`.

Errors are `GatewayError`s: 401 for missing/invalid credentials, 403 for an unknown tenant,
503 when the key store or the JWKS cannot be reached (a server fault, not the caller's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from modelyard.gateway.base import ALL_SCOPES, ANONYMOUS, Principal
from modelyard.gateway.config import INFER_SCOPE, GatewayConfig, JwtConfig, Quota, TenantConfig
from modelyard.gateway.errors import GatewayError, forbidden, unauthorized, unavailable
from modelyard.gateway.jwt_auth import JwksUnavailable, JwtError, JwtVerifier
from modelyard.gateway.keys import KEY_PREFIX, KeyRecord, KeyStore

log = logging.getLogger("modelyard.gateway")


@dataclass(frozen=True, slots=True)
class Identity:
    """The outcome of authentication."""

    principal: Principal  # who is calling
    quota: Quota  # the limits that apply to the principal's tenant


def credentials_from_headers(headers: dict[bytes, bytes]) -> str | None:
    """The API key or token a request presents, or None. Header names must be lower-case."""
    api_key = headers.get(b"x-api-key")
    if api_key:
        return api_key.decode("latin-1").strip() or None
    authorization = headers.get(b"authorization", b"").decode("latin-1").strip()
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


_INFER_ONLY = frozenset({INFER_SCOPE})


def _jwt_grants_admin(config: JwtConfig, claims: dict[str, object]) -> bool:
    """Whether the token's scope claim (a space-separated string or a list) holds admin."""
    value = claims.get(config.scope_claim)
    scopes = value.split() if isinstance(value, str) else value
    return isinstance(scopes, list) and config.admin_scope in scopes


class KeyLookup:
    """Finds key records off the event loop, caching answers for `ttl_s` (0: no cache)."""

    def __init__(
        self, store: KeyStore, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._clock = clock
        self._cache: dict[str, tuple[float, KeyRecord | None]] = {}

    async def find(self, key: str) -> KeyRecord | None:
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        record = await asyncio.to_thread(self.store.find, key)
        if self.ttl_s > 0:
            if len(self._cache) > 10_000:  # bound memory against random-key floods
                self._cache.clear()
            self._cache[key] = (now + self.ttl_s, record)
        return record


class Authenticator:
    """Turns request headers into an Identity; `enabled=False` yields the anonymous principal."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        enabled: bool,
        keys: KeyLookup | None = None,
        jwt: JwtVerifier | None = None,
    ) -> None:
        self.config = config
        self.enabled = enabled
        self.keys = keys
        self.jwt = jwt
        self._identities: dict[KeyRecord, Identity] = {}  # records are frozen: safe to memoize

    async def authenticate(self, headers: dict[bytes, bytes]) -> Identity:
        if not self.enabled:
            return Identity(ANONYMOUS, self.config.rate_limit.default_quota)
        credential = credentials_from_headers(headers)
        if credential is None:
            raise unauthorized("missing credentials: send Authorization: Bearer <key> or x-api-key")
        if credential.startswith(KEY_PREFIX) or self.jwt is None:
            return await self._from_key(credential)
        return await self._from_jwt(self.jwt, credential)

    async def _from_key(self, key: str) -> Identity:
        try:
            record = await self.keys.find(key) if self.keys is not None else None
        except Exception as exc:  # sqlite3.Error, RedisError, OSError: the store, not the key
            log.error("API key store unavailable: %s: %s", type(exc).__name__, exc)
            raise unavailable("credential store unavailable") from exc
        if record is None:
            raise unauthorized("invalid API key")
        identity = self._identities.get(record)
        if identity is None:
            if len(self._identities) > 10_000:
                self._identities.clear()
            identity = self._identities[record] = self._key_identity(record)
        return identity

    def _key_identity(self, record: KeyRecord) -> Identity:
        tenant = self.config.tenants.get(record.tenant) or TenantConfig(name=record.tenant)
        models = frozenset(record.models) if record.models is not None else tenant.models
        principal = Principal(
            tenant=record.tenant,
            key_id=record.key_id,
            priority=record.priority if record.priority is not None else tenant.priority,
            allowed_models=models,
            scopes=ALL_SCOPES if record.admin or tenant.admin else _INFER_ONLY,
        )
        key_quota = Quota(
            rpm=record.rpm, tpm=record.tpm, ipm=record.ipm, max_concurrent=record.max_concurrent
        )
        return Identity(principal, self._tenant_quota(tenant).overridden_by(key_quota))

    async def _from_jwt(self, verifier: JwtVerifier, token: str) -> Identity:
        try:
            claims = await verifier.verify(token)
            tenant_id = verifier.tenant_of(claims)
        except JwksUnavailable as exc:
            log.error("JWT keys unavailable: %s", exc.__cause__ or exc)
            raise unavailable("token keys unavailable") from exc
        except JwtError as exc:
            raise unauthorized(str(exc)) from exc
        tenant = self.config.tenants.get(tenant_id)
        if tenant is None:
            raise forbidden(f"unknown tenant {tenant_id!r}", code="unknown_tenant")
        subject = claims.get("sub")
        principal = Principal(
            tenant=tenant_id,
            key_id=subject if isinstance(subject, str) else None,
            priority=tenant.priority,
            allowed_models=tenant.models,
            scopes=ALL_SCOPES
            if tenant.admin or _jwt_grants_admin(verifier.config, claims)
            else (_INFER_ONLY),
        )
        return Identity(principal, self._tenant_quota(tenant))

    def _tenant_quota(self, tenant: TenantConfig) -> Quota:
        return self.config.rate_limit.default_quota.overridden_by(tenant.quota)


__all__ = ["Authenticator", "GatewayError", "Identity", "KeyLookup", "credentials_from_headers"]
