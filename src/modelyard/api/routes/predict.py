"""Textbook-compatible model routes over the manager.

- `POST /predict`: JSON `{"model_id": id|name|alias, "input_data": ..., "options": {...}}`, or a
  multipart form with `model_id`, one or more `file` uploads (images) and optional `options`
  (a JSON string). Answers `{"model_id", "kind", "predictions": [one output per input]}` with
  the kind's fixed shape (backends/base.py); a single input still gets a one-element list.
  Tensor models (ONNX, Triton) take named tensors, KServe's or the textbook's
  (`{"data_0": {"shape": [3, 224, 224], "data": [...], "dtype": "float32"}}`), checked against
  the model's input metadata (400 naming the input on a mismatch). Goes through the request
  path (gateway/request_path.py): allow-list, routing, quotas (one input = one item), usage.
- `GET /models`: the textbook's `available_models` / `loaded_models` objects keyed by model id,
  and the richer per-model list under `models` (api/listing.py: only what the caller may see).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile

from modelyard.api.errors import APIError, parsing_request
from modelyard.api.inputs import items_for_kind
from modelyard.api.listing import models_listing
from modelyard.backends.image import MAX_IMAGE_BYTES
from modelyard.backends.tensors import named_tensors
from modelyard.gateway.request_path import (
    Demand,
    RequestPath,
    declared_bytes,
    runs_model,
)
from modelyard.manager.base import Lease
from modelyard.model_spec import ModelKind

router = APIRouter()


async def _read_body(request: Request) -> tuple[str, Any, dict[str, Any]]:
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        return await _read_form(request)
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError("request body is not valid JSON") from exc
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    model_id, input_data = body.get("model_id"), body.get("input_data")
    options = body.get("options") or {}
    if not isinstance(model_id, str) or not model_id:
        raise ValueError("model_id: a model id, name or alias is required")
    if input_data is None:
        raise ValueError("input_data is required")
    if not isinstance(options, dict):
        raise ValueError("options must be an object")
    return model_id, input_data, options


async def _read_form(request: Request) -> tuple[str, Any, dict[str, Any]]:
    form = await request.form(max_files=64)
    model_id = form.get("model_id")
    if not isinstance(model_id, str) or not model_id:
        raise ValueError("model_id: a model id, name or alias is required")
    files = [f for f in form.getlist("file") if isinstance(f, UploadFile)]
    if not files:
        raise ValueError("upload at least one image as the form field 'file'")
    images = []
    for upload in files:
        data = await upload.read(MAX_IMAGE_BYTES + 1)
        if len(data) > MAX_IMAGE_BYTES:
            raise ValueError(f"image larger than {MAX_IMAGE_BYTES} bytes")
        images.append(data)
    raw_options = form.get("options")
    options = json.loads(raw_options) if isinstance(raw_options, str) and raw_options else {}
    if not isinstance(options, dict):
        raise ValueError("options must be a JSON object")
    return model_id, images, options


@router.post("/predict")
@runs_model
async def predict(request: Request) -> dict[str, Any]:
    with parsing_request():
        model_id, input_data, options = await _read_body(request)
    uploads = isinstance(input_data, list) and all(isinstance(i, bytes) for i in input_data)
    count = len(input_data) if isinstance(input_data, list) else 1
    demand = Demand.inference(items=count, input_bytes=declared_bytes(request))

    async def run(lease: Lease) -> Any:
        try:
            items = input_data if uploads else items_for_kind(lease.kind, input_data)
            if lease.kind == ModelKind.TENSOR:
                inputs = lease.metadata.get("inputs", [])
                items = [named_tensors(item, inputs) for item in items]
            return await lease.predictor.predict(items, options)
        except ValueError as exc:  # the inputs or the options were wrong for this model
            raise APIError(400, str(exc), param=_bad_field(str(exc), options)) from exc

    path: RequestPath = request.app.state.request_path
    outputs, lease = await path.predict(request, model_id, demand, run)
    return {"model_id": lease.model_id, "kind": str(lease.kind), "predictions": outputs}


def _bad_field(message: str, options: dict[str, Any]) -> str:
    """`options` when the message names one of them ("top_k must be ..."), else the input."""
    return "options" if message.split(" ", 1)[0] in options else "input_data"


@router.get("/models")
async def models(request: Request) -> dict[str, Any]:
    return models_listing(request)
