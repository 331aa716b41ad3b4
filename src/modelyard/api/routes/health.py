"""Liveness, readiness and a debug view of engine state.

- `GET /health`: 200 `{"status": "ok"}` whenever the process serves HTTP.
- `GET /ready`: 503 `{"status": "loading"}` (Retry-After) until the preloaded models are ready,
  then 200 `{"status": "ready"}`; 503 `{"status": "failed", "error"}` if startup failed. Each
  answer carries `kernels`: the runner's native kernels as the startup check found them
  (`{"kind", "source", "error"}`, observability/kernels.py; null until checked). Kind "none"
  with an error does not fail readiness (the models serve, slower), but says why.
- `GET /debug/engine_stats?model=<name>`: the model's latest SchedulerStats (running, waiting,
  free KV blocks, aborted requests...) of a loaded model, never loading one; admin scope (anyone
  when auth is off); disabled by `server.debug_endpoints: false`. Tests use it to see that
  aborted requests were aborted and freed their blocks.
"""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse

from modelyard.api.errors import APIError
from modelyard.gateway.request_path import provider_of, require_admin

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    state = request.app.state
    kernels = None if state.kernels is None else msgspec.to_builtins(state.kernels)
    if state.ready:
        return JSONResponse({"status": "ready", "kernels": kernels})
    if state.startup_error is not None:
        body = {"status": "failed", "error": state.startup_error, "kernels": kernels}
        return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})
    body = {"status": "loading", "kernels": kernels}
    return JSONResponse(body, status_code=503, headers={"Retry-After": "1"})


@router.get("/debug/engine_stats", dependencies=[Depends(require_admin)])
async def engine_stats(model: str, request: Request) -> dict[str, Any]:
    if not request.app.state.config.server.debug_endpoints:
        raise APIError(404, "debug endpoints are disabled")
    provider = provider_of(request)
    model_id = provider.spec(model).id
    stats = provider.engine_stats().get(model_id)
    if stats is None:
        raise APIError(400, f"{model_id} is not a loaded LLM", param="model")
    return {"model": model_id, "stats": msgspec.to_builtins(stats)}
