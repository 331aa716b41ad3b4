"""KServe v2 / Open Inference Protocol (HTTP/REST) and Triton's model-repository extension.

- `GET /v2/health/live`, `GET /v2/health/ready` (503 until the manager is ready);
- `GET /v2` (server metadata), `GET /v2/models/{name}[/versions/{v}]` (model metadata; a tensor
  model is loaded to read its metadata), `GET .../ready` (200 when loaded, 400 otherwise, as
  Triton does);
- `POST /v2/models/{name}[/versions/{v}]/infer`: JSON tensors, or Triton's binary extension,
  through the request path (gateway/request_path.py): allow-list, routing, quotas (the first
  input's batch dimension counts the items), usage, `x-modelyard-route`;
- `POST /v2/repository/index`: the models the caller may use (admins also see why a model is
  unavailable); `POST /v2/repository/models/{name}/load|unload`: admin scope only.

Model metadata and readiness are answered only for models the caller may use (403 otherwise).
Errors are `{"error": "..."}` (api/errors.py maps exceptions under /v2): 400 bad input, 403 not
allowed, 404 unknown model, 503 not loadable now. Enough of Triton's shape that
`tritonclient.http` drives it.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

import modelyard
from modelyard.api.errors import APIError, parsing_request
from modelyard.api.kserve_format import (
    default_metadata,
    items_from_request,
    outputs_to_tensors,
    parse_infer_body,
)
from modelyard.api.listing import visible_catalog
from modelyard.gateway.request_path import (
    Demand,
    RequestPath,
    declared_bytes,
    provider_of,
    require_admin,
    runs_model,
    ticket_of,
)
from modelyard.manager.base import Lease
from modelyard.model_spec import ModelKind

router = APIRouter()


def _is_ready(request: Request) -> bool:
    return bool(request.app.state.ready) and provider_of(request).ready


@router.get("/v2/health/live")
async def live() -> dict[str, bool]:
    return {"live": True}


@router.get("/v2/health/ready")
async def ready(request: Request) -> JSONResponse:
    is_ready = _is_ready(request)
    return JSONResponse({"ready": is_ready}, status_code=200 if is_ready else 503)


@router.get("/v2")
async def server_metadata() -> dict[str, Any]:
    return {
        "name": "modelyard",
        "version": getattr(modelyard, "__version__", "0.1.0"),
        "extensions": ["model_repository", "binary_tensor_data"],
    }


def _check_version(spec: Any, version: str | None) -> None:
    if version is not None and version != spec.version:
        raise APIError(404, f"model {spec.id} has no version {version}")


@router.get("/v2/models/{name}")
@router.get("/v2/models/{name}/versions/{version}")
async def model_metadata(name: str, request: Request, version: str | None = None) -> dict[str, Any]:
    provider = provider_of(request)
    _path(request).authorize(ticket_of(request), name)
    spec = provider.spec(name)
    _check_version(spec, version)
    if spec.kind.is_llm:
        raise APIError(400, f"{spec.id} is an LLM: use the OpenAI routes under /v1")
    metadata = provider.metadata(spec.id)
    if metadata is None and spec.kind == ModelKind.TENSOR:
        metadata = await _path(request).metadata(spec.id)
    if metadata is None or spec.kind != ModelKind.TENSOR:
        metadata = default_metadata(spec.kind)
    return {
        "name": spec.id,
        "versions": [spec.version],
        "platform": spec.backend,
        "inputs": metadata.get("inputs", []),
        "outputs": metadata.get("outputs", []),
    }


@router.get("/v2/models/{name}/ready")
@router.get("/v2/models/{name}/versions/{version}/ready")
async def model_ready(name: str, request: Request, version: str | None = None) -> JSONResponse:
    provider = provider_of(request)
    _path(request).authorize(ticket_of(request), name)
    spec = provider.spec(name)
    _check_version(spec, version)
    loaded = str(provider.state(spec.id)) == "loaded"
    body = {"name": spec.id, "ready": loaded}
    return JSONResponse(body, status_code=200 if loaded else 400)


@router.post("/v2/models/{name}/infer")
@router.post("/v2/models/{name}/versions/{version}/infer")
@runs_model
async def infer(name: str, request: Request, version: str | None = None) -> dict[str, Any]:
    raw = await request.body()
    with parsing_request():
        body = parse_infer_body(raw, request.headers.get("inference-header-content-length"))
        parameters = body.get("parameters") or {}
        options = {k: v for k, v in parameters.items() if k in ("top_k", "labels")}
        wanted = [output["name"] for output in body.get("outputs", [])]
    demand = Demand.inference(items=_batch_size(body), input_bytes=declared_bytes(request))

    async def run(lease: Lease) -> Any:
        _check_version(provider_of(request).spec(lease.model_id), version)
        with parsing_request():
            items = items_from_request(lease.kind, body)
        return await lease.predictor.predict(items, options)

    outputs, lease = await _path(request).predict(request, name, demand, run)
    spec = provider_of(request).spec(lease.model_id)
    return {
        "model_name": spec.id,
        "model_version": spec.version,
        "id": str(body.get("id") or uuid.uuid4().hex),
        "outputs": outputs_to_tensors(lease.kind, outputs, wanted or None),
    }


def _batch_size(body: dict[str, Any]) -> int:
    """Items of an infer request: the first input's first dimension (1 for a scalar)."""
    inputs = body.get("inputs") or []
    shape = inputs[0].get("shape") if inputs and isinstance(inputs[0], dict) else None
    if isinstance(shape, list) and shape and isinstance(shape[0], int) and shape[0] > 0:
        return int(shape[0])
    return 1


def _path(request: Request) -> RequestPath:
    path: RequestPath = request.app.state.request_path
    return path


@router.post("/v2/repository/index")
async def repository_index(request: Request) -> list[dict[str, Any]]:
    models, _, admin = visible_catalog(request)
    states = {"loaded": "READY", "loading": "LOADING", "failed": "UNAVAILABLE"}
    index = []
    for model in models:
        entry = {
            "name": model["id"],
            "version": model.get("version", "1"),
            "state": states.get(model.get("state", ""), "UNAVAILABLE"),
        }
        if admin:
            entry["reason"] = model.get("last_error") or ""
        index.append(entry)
    return index


@router.post("/v2/repository/models/{name}/load", dependencies=[Depends(require_admin)])
async def repository_load(name: str, request: Request) -> dict[str, Any]:
    await provider_of(request).load(name)
    return {}


@router.post("/v2/repository/models/{name}/unload", dependencies=[Depends(require_admin)])
async def repository_unload(name: str, request: Request) -> dict[str, Any]:
    await provider_of(request).unload(name)
    return {}
