"""What a caller may see of the models (`GET /models`, `GET /v1/models`, `/v2/repository/index`).

A tenant sees exactly the catalog models its allow-list lets it call (an entry names a model by
any of its names: gateway/model_names.py; /v1/models also lists the route names and LoRA adapters
it may call) and, of each, what it is, what an LLM serves (`capabilities`: chat, tools,
structured output; docs/agents.md) and whether it is loaded: never
worker process ids, memory figures, the memory budget or load errors. An admin (or anyone when
auth is off) sees everything the manager reports.

`GET /models` keeps the textbook's shape: `available_models` and `loaded_models` are objects
keyed by model id (`{id: {id, name, type, framework, version, description}}` and
`{id: name}`); the richer per-model list is under `models`.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from modelyard.gateway.request_path import RequestPath, principal_of, provider_of

#: Per-model fields a tenant may see (the rest is for admins).
PUBLIC_FIELDS = (
    "id",
    "name",
    "aliases",
    "kind",
    "backend",
    "version",
    "description",
    "state",
    "capabilities",
)


def may_call(request: Request, name: str) -> bool:
    """Whether the caller may call the model `name` (the request path's own rule)."""
    path: RequestPath = request.app.state.request_path
    return path.names.allows(principal_of(request), name)


def visible_catalog(request: Request) -> tuple[list[dict[str, Any]], dict[str, Any], bool]:
    """(the catalog models the caller may use, the provider's whole listing, is admin)."""
    described = provider_of(request).describe()
    available = described.get("available_models", [])
    models = [
        dict(m) for m in available if isinstance(m, dict) and may_call(request, str(m.get("id")))
    ]
    return models, described, principal_of(request).is_admin


def visible_model_names(request: Request) -> dict[str, dict[str, bool] | None]:
    """Catalog ids, then route names, that the caller may use (for /v1/models), each with its
    LLM `capabilities` (None for a route or a model that is no LLM)."""
    models, _, _ = visible_catalog(request)
    names: dict[str, dict[str, bool] | None] = {str(m["id"]): m.get("capabilities") for m in models}
    for route in request.app.state.router.route_names():
        if route not in names and may_call(request, route):
            names[route] = None
    return names


def models_listing(request: Request) -> dict[str, Any]:
    """The `GET /models` body (see the module docstring)."""
    models, described, admin = visible_catalog(request)
    loaded = {str(m["id"]): m for m in described.get("loaded_models", []) if isinstance(m, dict)}
    rich = []
    for model in models:
        details = loaded.get(str(model["id"]))
        if admin:
            rich.append({**model, **(details or {})})
        else:
            rich.append({k: model[k] for k in PUBLIC_FIELDS if k in model})
    body: dict[str, Any] = {
        "available_models": {
            str(m["id"]): {
                "id": m["id"],
                "name": m.get("name") or m["id"],
                "type": m.get("kind"),
                "framework": m.get("backend"),
                "version": m.get("version"),
                "description": m.get("description"),
            }
            for m in models
        },
        "loaded_models": {
            str(m["id"]): m.get("name") or m["id"] for m in models if str(m["id"]) in loaded
        },
        "models": rich,
        "ready": described.get("ready", True),
    }
    if admin:
        body["memory"] = described.get("memory")
        body["stats"] = described.get("stats")
    return body
