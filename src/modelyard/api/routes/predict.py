"""Textbook-compatible model routes over the manager.

- `POST /predict`: JSON `{"model_id": id|name|alias, "input_data": ..., "options": {...}}`, or a
  multipart form with `model_id`, one or more `file` uploads (images) and optional `options`
  (a JSON string). Answers `{"model_id", "kind", "predictions": [one output per input]}` with
  the kind's fixed shape (backends/base.py); a single input still gets a one-element list.
- `GET /models`: the manager's listing (`available_models`, `loaded_models` with memory, state,
  last use and active leases, memory budget, counters).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile

from modelyard.api.inputs import items_for_kind
from modelyard.backends.image import MAX_IMAGE_BYTES

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
async def predict(request: Request) -> dict[str, Any]:
    model_id, input_data, options = await _read_body(request)
    provider = request.app.state.provider
    async with provider.lease(model_id) as lease:
        items = (
            input_data
            if isinstance(input_data, list) and all(isinstance(i, bytes) for i in input_data)
            else items_for_kind(lease.kind, input_data)
        )
        outputs = await lease.predictor.predict(items, options)
    return {"model_id": lease.model_id, "kind": str(lease.kind), "predictions": outputs}


@router.get("/models")
async def models(request: Request) -> dict[str, Any]:
    described: dict[str, Any] = request.app.state.provider.describe()
    return described
