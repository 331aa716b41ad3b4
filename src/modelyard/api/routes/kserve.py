"""KServe v2 / Open Inference Protocol (HTTP/REST) and Triton's model-repository extension.

- `GET /v2/health/live`, `GET /v2/health/ready` (503 until the manager is ready);
- `GET /v2` (server metadata), `GET /v2/models/{name}[/versions/{v}]` (model metadata; a tensor
  model is loaded to read its metadata), `GET .../ready` (200 when loaded, 400 otherwise, as
  Triton does);
- `POST /v2/models/{name}[/versions/{v}]/infer`: JSON tensors, or Triton's binary extension;
- `POST /v2/repository/index`, `POST /v2/repository/models/{name}/load|unload`.

Errors are `{"error": "..."}` (api/errors.py maps exceptions under /v2): 400 bad input, 404
unknown model, 503 not loadable now. Enough of Triton's shape that `tritonclient.http` drives it.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

import modelyard
from modelyard.api.errors import APIError
from modelyard.api.kserve_format import (
    default_metadata,
    items_from_request,
    outputs_to_tensors,
    parse_infer_body,
)
from modelyard.model_spec import ModelKind

router = APIRouter()


def _provider(request: Request) -> Any:
    return request.app.state.provider


def _is_ready(request: Request) -> bool:
    return bool(getattr(request.app.state, "ready", True)) and bool(
        getattr(_provider(request), "ready", True)
    )


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
    provider = _provider(request)
    spec = provider.spec(name)
    _check_version(spec, version)
    if spec.kind.is_llm:
        raise APIError(400, f"{spec.id} is an LLM: use the OpenAI routes under /v1")
    metadata = provider.metadata(spec.id)
    if metadata is None and spec.kind == ModelKind.TENSOR:
        async with provider.lease(spec.id) as lease:
            metadata = lease.metadata
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
    provider = _provider(request)
    spec = provider.spec(name)
    _check_version(spec, version)
    loaded = str(provider.state(spec.id)) == "loaded"
    body = {"name": spec.id, "ready": loaded}
    return JSONResponse(body, status_code=200 if loaded else 400)


@router.post("/v2/models/{name}/infer")
@router.post("/v2/models/{name}/versions/{version}/infer")
async def infer(name: str, request: Request, version: str | None = None) -> dict[str, Any]:
    provider = _provider(request)
    spec = provider.spec(name)
    _check_version(spec, version)
    if spec.kind.is_llm:
        raise APIError(400, f"{spec.id} is an LLM: use the OpenAI routes under /v1")
    body = parse_infer_body(
        await request.body(), request.headers.get("inference-header-content-length")
    )
    parameters = body.get("parameters") or {}
    options = {k: v for k, v in parameters.items() if k in ("top_k", "labels")}
    wanted = [str(o.get("name")) for o in body.get("outputs") or [] if isinstance(o, dict)]
    items = items_from_request(spec.kind, body)
    async with provider.lease(spec.id) as lease:
        outputs = await lease.predictor.predict(items, options)
    return {
        "model_name": spec.id,
        "model_version": spec.version,
        "id": str(body.get("id") or uuid.uuid4().hex),
        "outputs": outputs_to_tensors(spec.kind, outputs, wanted or None),
    }


@router.post("/v2/repository/index")
async def repository_index(request: Request) -> list[dict[str, Any]]:
    described = _provider(request).describe()
    states = {"loaded": "READY", "loading": "LOADING", "failed": "UNAVAILABLE"}
    return [
        {
            "name": model["id"],
            "version": model.get("version", "1"),
            "state": states.get(model.get("state", ""), "UNAVAILABLE"),
            "reason": model.get("last_error") or "",
        }
        for model in described.get("available_models", [])
    ]


@router.post("/v2/repository/models/{name}/load")
async def repository_load(name: str, request: Request) -> dict[str, Any]:
    await _provider(request).load(name)
    return {}


@router.post("/v2/repository/models/{name}/unload")
async def repository_unload(name: str, request: Request) -> dict[str, Any]:
    await _provider(request).unload(name)
    return {}
