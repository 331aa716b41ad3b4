"""Shared helpers of the gateway tests: an RSA key + JWKS made on the spot, token minting, and a
small FastAPI app with the real gateway (middleware, request path, admin routes, error
handlers) in front of fake model routes over a fake provider.

The fake routes run no model but go through the request path exactly as the real ones do
(`@runs_model`, `Demand`, `RequestPath.open_llm` / `predict`): the path authorizes, routes,
admits, leases targets in order (models in `app.state.down` fail to load and are reported to
the router) and records usage. The chat route reports token counts taken from the body
(`x_prompt_tokens`, default 10; `x_completion_tokens`, default min(max_tokens, 5)) and answers
what it saw: served model, tenant, priority, key id, targets, estimated tokens.
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
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from fakes.models import GatewayModels
from modelyard.api.errors import install_exception_handlers
from modelyard.gateway.admin import router as admin_router
from modelyard.gateway.base import PRINCIPAL_SCOPE_KEY, USAGE_SCOPE_KEY, Principal, RequestUsage
from modelyard.gateway.config import GatewayConfig
from modelyard.gateway.gateway import Gateway, build_gateway
from modelyard.gateway.middleware import build_gateway_middleware
from modelyard.gateway.request_path import (
    Demand,
    RequestPath,
    admit_request,
    runs_model,
)
from modelyard.gateway.router import build_router
from modelyard.manager.base import Lease

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
    """A FastAPI app with the real gateway in front of fake model routes (module docstring)."""
    gw = gateway or build_gateway(config, **parts)
    app = FastAPI(
        middleware=build_gateway_middleware(config, gateway=gw),
        dependencies=[Depends(admit_request)],
    )
    install_exception_handlers(app)
    app.state.router = build_router(config)
    app.state.down = set()
    models = GatewayModels(app.state.down)
    app.state.request_path = RequestPath(models, app.state.router, timeout_s=30)  # type: ignore[arg-type]
    app.include_router(admin_router)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": []}

    @app.post("/v1/chat/completions")
    @runs_model
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        demand = Demand.generation(
            gw.config.rate_limit,
            body_bytes=len(await request.body()),
            max_tokens=body.get("max_tokens"),
            sequences=1,
        )

        async def start(lease: Lease) -> None:
            return None

        served = await app.state.request_path.open_llm(request, body["model"], demand, start)
        prompt = int(body.get("x_prompt_tokens", 10))
        completion = int(body.get("x_completion_tokens", min(body.get("max_tokens", 5), 5)))
        served.record_tokens(prompt, completion)
        await served.aclose()
        return _seen(request, served.model_id, served.decision.targets)

    @app.post("/v2/models/{name}/infer")
    @runs_model
    async def infer(name: str, request: Request) -> JSONResponse:
        body = await request.json()
        items = len(body.get("inputs") or [None])
        demand = Demand.inference(items=items, input_bytes=len(await request.body()))

        async def run(lease: Lease) -> None:
            return None

        _, lease = await app.state.request_path.predict(request, name, demand, run)
        return _seen(request, lease.model_id, [])

    return app


def _seen(request: Request, served: str, targets: list[str]) -> JSONResponse:
    principal: Principal = request.scope[PRINCIPAL_SCOPE_KEY]
    usage: RequestUsage = request.scope[USAGE_SCOPE_KEY]
    content = {
        "model": served,
        "tenant": principal.tenant,
        "priority": principal.priority,
        "key_id": principal.key_id,
        "targets": targets,
        "estimated_tokens": usage.estimated_tokens,
    }
    return JSONResponse(content)


def app_from_env() -> FastAPI:
    """uvicorn factory for the e2e servers: the gateway config is the YAML at $GW_TEST_CONFIG."""
    data = yaml.safe_load(Path(os.environ["GW_TEST_CONFIG"]).read_text()) or {}
    return build_fake_app(GatewayConfig.from_dict(data.get("gateway")))
