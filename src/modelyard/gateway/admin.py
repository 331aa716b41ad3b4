"""Admin routes: `GET /admin/usage` (per-tenant usage of this process), admin principals only."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from modelyard.gateway.base import PRINCIPAL_SCOPE_KEY, Principal
from modelyard.gateway.errors import error_body, forbidden
from modelyard.gateway.gateway import Gateway
from modelyard.gateway.middleware import GATEWAY_KEY

router = APIRouter()


@router.get("/admin/usage", response_model=None)
async def usage(request: Request) -> Response:
    """{"since": unix time, "tenants": {tenant: {requests, prompt_tokens, completion_tokens,
    rejections: {limit: n}}}}; 403 unless the caller is an admin."""
    principal: Principal | None = request.scope.get(PRINCIPAL_SCOPE_KEY)
    gateway: Gateway | None = request.scope.get(GATEWAY_KEY)
    if principal is None or gateway is None or not principal.is_admin:
        body = error_body(request.url.path, forbidden("admin key required"))
        return Response(body, status_code=403, media_type="application/json")
    return JSONResponse(gateway.usage.snapshot())
