"""Admin routes (admin scope; anyone when auth is off): `GET /admin/usage`, the per-tenant usage
of this process."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from modelyard.gateway.gateway import Gateway
from modelyard.gateway.middleware import GATEWAY_KEY
from modelyard.gateway.request_path import require_admin

router = APIRouter(dependencies=[Depends(require_admin)])


@router.get("/admin/usage")
async def usage(request: Request) -> dict[str, Any]:
    """{"since": unix time, "tenants": {tenant: {requests, prompt_tokens, completion_tokens,
    rejections: {limit: n}, models: {model: {requests, prompt_tokens, completion_tokens, items,
    input_bytes, policies: {policy: n}}}}}}."""
    gateway: Gateway = request.scope[GATEWAY_KEY]
    return gateway.usage.snapshot()
