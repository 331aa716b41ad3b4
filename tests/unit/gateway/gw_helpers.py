"""Shared helpers of the gateway tests: an RSA key + JWKS made on the spot, token minting, and a
small FastAPI app built with the gateway middleware and a fake model handler.

The fake handler behaves like the real ones per the gateway contracts: it reads the Principal,
routes through `app.state.router`, leases targets in order (models in `app.state.down` fail,
reported to the router), sets `x-modelyard-route`, and fills the RequestUsage with token counts
taken from the body (`x_prompt_tokens`, default 10; `x_completion_tokens`, default
min(max_tokens, 5)).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import jwt
import yaml
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from modelyard.gateway.admin import router as admin_router
from modelyard.gateway.base import PRINCIPAL_SCOPE_KEY, USAGE_SCOPE_KEY, Principal, RequestUsage
from modelyard.gateway.config import GatewayConfig
from modelyard.gateway.gateway import Gateway
from modelyard.gateway.middleware import build_gateway_middleware
from modelyard.gateway.router import build_router

ISSUER = "https://idp.test"
AUDIENCE = "modelyard"


class RsaSigner:
    """An RSA key pair and its public JWKS entry."""

    def __init__(self, kid: str) -> None:
        self.kid = kid
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwk(self) -> dict[str, Any]:
        entry: dict[str, Any] = json.loads(
            jwt.algorithms.RSAAlgorithm.to_jwk(self.private.public_key())
        )
        entry.update(kid=self.kid, alg="RS256", use="sig")
        return entry

    def token(self, tenant: str = "acme", *, kid: str | None = None, **claims: Any) -> str:
        """A signed RS256 token; `claims` override the defaults (None removes one)."""
        now = int(time.time())
        payload: dict[str, Any] = {
            "sub": "user-1",
            "tenant": tenant,
            "aud": AUDIENCE,
            "iss": ISSUER,
            "iat": now,
            "exp": now + 300,
        }
        payload.update(claims)
        payload = {k: v for k, v in payload.items() if v is not None}
        headers = {"kid": kid or self.kid}
        return jwt.encode(payload, self.private, algorithm="RS256", headers=headers)


def write_jwks(path: Path, *signers: RsaSigner) -> Path:
    path.write_text(json.dumps({"keys": [s.jwk() for s in signers]}))
    return path


def build_fake_app(
    config: GatewayConfig, *, gateway: Gateway | None = None, **parts: Any
) -> FastAPI:
    """A FastAPI app with the gateway middleware, the admin routes and fake model handlers."""
    app = FastAPI(middleware=build_gateway_middleware(config, gateway=gateway, **parts))
    app.state.router = build_router(config)
    app.state.down = set()
    app.include_router(admin_router)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": []}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        return _serve(request, body["model"], body)

    @app.post("/v2/models/{name}/infer")
    async def infer(name: str, request: Request) -> JSONResponse:
        body = await request.json()
        return _serve(request, name, body)

    return app


def _serve(request: Request, requested: str, body: dict[str, Any]) -> JSONResponse:
    principal: Principal = request.scope[PRINCIPAL_SCOPE_KEY]
    usage: RequestUsage = request.scope[USAGE_SCOPE_KEY]
    router = request.app.state.router
    decision = router.route(requested, principal)
    served = None
    for target in decision.targets:
        if target in request.app.state.down:
            if hasattr(router, "report_failure"):
                router.report_failure(target)
            continue
        served = target
        break
    if served is None:
        return JSONResponse({"error": {"message": "all targets down"}}, status_code=503)
    usage.model = served
    usage.prompt_tokens = int(body.get("x_prompt_tokens", 10))
    usage.completion_tokens = int(
        body.get("x_completion_tokens", min(body.get("max_tokens", 5), 5))
    )
    content = {
        "model": served,
        "tenant": principal.tenant,
        "priority": principal.priority,
        "key_id": principal.key_id,
        "targets": decision.targets,
        "estimated_tokens": usage.estimated_tokens,
    }
    return JSONResponse(content, headers={"x-modelyard-route": decision.header})


def app_from_env() -> FastAPI:
    """uvicorn factory for the e2e servers: the gateway config is the YAML at $GW_TEST_CONFIG."""
    data = yaml.safe_load(Path(os.environ["GW_TEST_CONFIG"]).read_text()) or {}
    return build_fake_app(GatewayConfig.from_dict(data.get("gateway")))
