"""The web console: its static files, and the one JSON document its dashboard polls.

- `GET /ui` redirects to `/ui/`, which is `modelyard/ui/index.html`; `GET /ui/static/{path}`
  is one of the files shipped under `modelyard/ui/static/` (anything else: 404). The gateway
  lets these through without a key (its default open paths), so the page can ask for one;
  every call the page makes for data carries the key as a Bearer token.
- `GET /ui/api/summary`: what the dashboard shows, behind the gateway like every data route:
  `{"time", "ready", "viewer": {"tenant", "admin", "auth"}, "models": [catalog entry + state,
  memory, engine stats when loaded], "memory": {budget, used, reserved}, "metrics": {model:
  cumulative counters and histograms (observability/summary.py)}, "usage": {"since",
  "tenants"} or null}`. An admin (or anyone when auth is off) sees all of it. A tenant sees
  the models it may use (what each is and its state: no memory, process ids, engine stats or
  errors), no memory budget, the metrics of its own requests only, and its own usage.
  `"features": {"prefixes", "agent"}` say whether the optional APIs the console can use
  (OPTIONAL_APIS) are served here.

Files are read by FileResponse in a worker thread, the metrics in another: the event loop only
reads the manager's listing (as `/models` does).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Match

from modelyard.api.listing import PUBLIC_FIELDS, visible_catalog
from modelyard.gateway.base import Principal
from modelyard.gateway.gateway import Gateway
from modelyard.gateway.middleware import GATEWAY_KEY
from modelyard.gateway.request_path import principal_of
from modelyard.observability.metrics import MODEL_EVICTIONS
from modelyard.observability.summary import counter_by_model, model_metrics

UI_ROOT = Path(__file__).resolve().parents[2] / "ui"
_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
_HEADERS = {
    "cache-control": "no-cache",  # revalidated by ETag: an upgraded server serves its own files
    "x-content-type-options": "nosniff",
    "content-security-policy": (
        "default-src 'self'; img-src 'self' blob: data:; frame-ancestors 'none'; "
        "base-uri 'none'; form-action 'none'"
    ),
}

# What a tenant sees of each model (an admin, or anyone when auth is off, sees everything):
# the listings' fields, and the console's pin and status.
_PUBLIC_FIELDS = (*PUBLIC_FIELDS, "pin", "status")
# APIs the console uses when the server has them: pinned prefixes (CAG) and the knowledge agent.
OPTIONAL_APIS = {"prefixes": ("GET", "/v1/prefixes"), "agent": ("POST", "/v1/agent/ask")}

router = APIRouter(include_in_schema=False)


def _manifest(root: Path) -> dict[str, Path]:
    """`{"js/app.js": path}` for every servable file under root (read once, at import)."""
    return {
        path.relative_to(root).as_posix(): path
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.suffix in _MEDIA_TYPES
    }


_STATIC = _manifest(UI_ROOT / "static")


def _file(path: Path) -> FileResponse:
    return FileResponse(path, media_type=_MEDIA_TYPES[path.suffix], headers=_HEADERS)


@router.api_route("/ui", methods=["GET", "HEAD"])
async def console_redirect() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@router.api_route("/ui/", methods=["GET", "HEAD"])
async def console_index() -> FileResponse:
    return _file(UI_ROOT / "index.html")


@router.api_route("/ui/static/{name:path}", methods=["GET", "HEAD"])
async def console_static(name: str) -> Response:
    path = _STATIC.get(name)
    if path is None:
        return Response("not found", status_code=404, media_type="text/plain")
    return _file(path)


@router.get("/ui/api/summary")
async def console_summary(request: Request) -> dict[str, Any]:
    principal = principal_of(request)
    gateway: Gateway | None = request.scope.get(GATEWAY_KEY)
    auth = gateway is not None and gateway.authenticator.enabled
    everything = principal.is_admin  # an admin, or anyone when auth is off
    allowed, listing, _ = visible_catalog(request)  # the policy of GET /models
    tenant = None if everything else principal.tenant
    metrics, evictions = await anyio.to_thread.run_sync(_read_metrics, tenant)
    models = models_with_state(listing, evictions)
    if not everything:
        visible = {m["id"] for m in allowed}
        models = [_public(m) for m in models if m["id"] in visible]
        metrics = {name: value for name, value in metrics.items() if name in visible}
    return {
        "time": time.time(),
        "ready": bool(request.app.state.ready),
        "viewer": {"tenant": principal.tenant, "admin": principal.is_admin, "auth": auth},
        "models": models,
        "memory": listing.get("memory", {}) if everything else None,
        "metrics": metrics,
        "usage": _usage(gateway, principal, everything),
        "features": _features(request),
    }


def _read_metrics(tenant: str | None) -> tuple[dict[str, Any], dict[str, float]]:
    """(the metrics the viewer may see, evictions per model): in a worker thread."""
    return model_metrics(tenant), counter_by_model(MODEL_EVICTIONS)


def _usage(gateway: Gateway | None, principal: Principal, everything: bool) -> Any:
    """The gateway's per-tenant usage: every tenant's, or the caller's own."""
    if gateway is None:
        return None
    usage: dict[str, Any] = gateway.usage.snapshot()
    if not everything:
        own = usage["tenants"].get(principal.tenant)
        usage["tenants"] = {principal.tenant: own} if own else {}
    return usage


def _public(model: dict[str, Any]) -> dict[str, Any]:
    """What a tenant may see of a model: what it is and its state (no memory, process ids,
    engine stats or load errors)."""
    return {key: model[key] for key in _PUBLIC_FIELDS if key in model}


def _features(request: Request) -> dict[str, bool]:
    """Which optional APIs this server has (the console hides what it cannot call)."""
    return {
        name: _serves(request.app.router.routes, path, method)
        for name, (method, path) in OPTIONAL_APIS.items()
    }


def _serves(routes: list[BaseRoute], path: str, method: str) -> bool:
    """Whether a route (included routers too) takes `method path`, as routing would match."""
    scope = {"type": "http", "path": path, "method": method, "root_path": ""}
    return any(route.matches(scope)[0] is Match.FULL for route in routes)


def models_with_state(listing: dict[str, Any], evictions: dict[str, float]) -> list[dict[str, Any]]:
    """The catalog entries, each with its loaded-model fields (memory, engine stats) merged in
    and `status`: loaded | loading | failed | evicted (unloaded after an eviction: `evictions`
    per model id) | unloaded."""
    loaded = {m["id"]: m for m in listing.get("loaded_models", [])}
    models = []
    for spec in listing.get("available_models", listing.get("models", [])):
        entry = {**spec, **loaded.get(spec["id"], {})}
        status = str(entry.get("state", "unloaded"))
        if status == "unloaded" and evictions.get(spec["id"], 0) > 0:
            status = "evicted"
        entry["status"] = status
        models.append(entry)
    return models
