"""JWT verification against a JWKS (file or URL), with a cached, refresh-limited key set.

Pipeline per token: read the unverified header -> find the key by `kid` (an unknown kid triggers
one JWKS refresh, at most one per `refresh_min_interval_s`) -> `jwt.decode` checks the signature,
the algorithm allow-list, exp/nbf/iat with leeway, `aud` and `iss` -> the tenant claim.
Every failure is an `AuthError` (401). The JWKS is read off the event loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jwt

from modelyard.gateway.config import JwtConfig


class JwtError(Exception):
    """The token is not acceptable (message says why; safe to return to the client)."""


class JwksUnavailable(JwtError):
    """The JWKS could not be fetched and no cached key fits: a server-side failure (503)."""


def _fetcher(config: JwtConfig) -> Callable[[], Awaitable[dict[str, Any]]]:
    if config.jwks_file is not None:
        path = Path(config.jwks_file).expanduser()

        async def read_file() -> dict[str, Any]:
            text = await asyncio.to_thread(path.read_text)
            data: dict[str, Any] = json.loads(text)
            return data

        return read_file
    url = config.jwks_url or ""

    async def fetch_url() -> dict[str, Any]:
        import httpx

        async with httpx.AsyncClient(timeout=5.0) as client:
            response = await client.get(url)
            response.raise_for_status()
            data: dict[str, Any] = response.json()
            return data

    return fetch_url


class JwksCache:
    """Keys by kid; refetched when older than cache_ttl_s or on an unknown kid (rate-limited)."""

    def __init__(
        self,
        config: JwtConfig,
        fetch: Callable[[], Awaitable[dict[str, Any]]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._fetch = fetch or _fetcher(config)
        self._clock = clock
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()
        self.refreshes = 0  # how many times the JWKS was fetched (tests, logs)

    async def _refresh(self) -> None:
        async with self._lock:
            try:
                data = await self._fetch()
            except Exception as exc:
                raise JwksUnavailable(f"JWKS unavailable: {type(exc).__name__}") from exc
            finally:
                self._fetched_at = self._clock()
                self.refreshes += 1
            keys: dict[str | None, jwt.PyJWK] = {}
            for entry in data.get("keys", []):
                try:
                    keys[entry.get("kid")] = jwt.PyJWK(entry)
                except jwt.PyJWTError:
                    continue  # unsupported key types are skipped, not fatal
            self._keys = keys

    async def key_for(self, kid: str | None) -> jwt.PyJWK:
        now = self._clock()
        stale = self._fetched_at is None or now - self._fetched_at >= self.config.cache_ttl_s
        may_refresh = (
            self._fetched_at is None or now - self._fetched_at >= self.config.refresh_min_interval_s
        )
        if stale or (kid not in self._keys and may_refresh):
            try:
                await self._refresh()
            except JwksUnavailable:
                if kid not in self._keys:
                    raise  # otherwise keep verifying with the cached key set
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        key = self._keys.get(kid)
        if key is None:
            raise JwtError("token signed with an unknown key id")
        return key


class JwtVerifier:
    """Verifies a bearer JWT and returns its claims."""

    def __init__(self, config: JwtConfig, jwks: JwksCache | None = None) -> None:
        self.config = config
        self.jwks = jwks or JwksCache(config)

    async def verify(self, token: str) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise JwtError("malformed token") from exc
        if header.get("alg") not in self.config.algorithms:
            raise JwtError("token algorithm not accepted")
        key = await self.jwks.key_for(header.get("kid"))
        options = {"require": ["exp"], "verify_aud": self.config.audience is not None}
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=list(self.config.algorithms),
                audience=self.config.audience,
                issuer=self.config.issuer,
                leeway=self.config.leeway_s,
                options=options,  # type: ignore[arg-type]
            )
        except jwt.ExpiredSignatureError as exc:
            raise JwtError("token expired") from exc
        except jwt.ImmatureSignatureError as exc:
            raise JwtError("token not yet valid") from exc
        except jwt.InvalidAudienceError as exc:
            raise JwtError("token audience not accepted") from exc
        except jwt.InvalidIssuerError as exc:
            raise JwtError("token issuer not accepted") from exc
        except jwt.PyJWTError as exc:
            raise JwtError("invalid token") from exc
        return claims

    def tenant_of(self, claims: dict[str, Any]) -> str:
        tenant = claims.get(self.config.tenant_claim)
        if not isinstance(tenant, str) or not tenant:
            raise JwtError(f"token has no {self.config.tenant_claim!r} claim")
        return tenant
