"""`POST /v1/embeddings` (OpenAI shape) over the manager's embedding models.

Request: `{"model", "input": str | [str], "encoding_format": "float"|"base64", "user"?}`.
Token-array inputs are refused (400): the embedding models tokenize themselves. `usage` counts
the tokens each model read (the backends report them for the option `usage: true`); a backend
that cannot count them (a remote Triton model) reports whitespace-separated words instead.
Errors use the OpenAI envelope (api/errors.py handlers). Goes through the request path
(gateway/request_path.py): allow-list, routing, quotas (each input is one item), usage.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from modelyard.api.errors import APIError
from modelyard.api.inputs import as_list
from modelyard.gateway.request_path import (
    Demand,
    RequestPath,
    declared_bytes,
    runs_model,
)
from modelyard.manager.base import Lease
from modelyard.model_spec import ModelKind

router = APIRouter()


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str  # catalog id, name or alias of an embedding model
    input: str | list[Any]  # one text or a list of texts
    encoding_format: Literal["float", "base64"] = "float"  # base64: little-endian float32
    user: str | None = None  # ignored (OpenAI compatibility)
    dimensions: int | None = None  # refused unless equal to the model's dimension


@router.post("/v1/embeddings")
@runs_model
async def create_embeddings(body: EmbeddingRequest, request: Request) -> dict[str, Any]:
    try:
        texts = as_list(body.input)
    except ValueError as exc:
        raise APIError(400, str(exc), param="input") from exc
    if not all(isinstance(text, str) for text in texts):
        raise APIError(400, "input must be a string or a list of strings", param="input")
    demand = Demand.inference(
        items=len(texts),
        input_bytes=declared_bytes(request),
        kinds=[ModelKind.EMBEDDING],
        serves="embedding models",
    )

    async def run(lease: Lease) -> Any:
        try:
            return await lease.predictor.predict(texts, {"usage": True})
        except ValueError as exc:  # a text the model refuses
            raise APIError(400, str(exc), param="input") from exc

    path: RequestPath = request.app.state.request_path
    outputs, lease = await path.predict(request, body.model, demand, run)
    vectors, tokens = _split_usage(outputs, texts)
    if body.dimensions is not None and vectors and body.dimensions != len(vectors[0]):
        raise APIError(400, f"dimensions must be {len(vectors[0])}", param="dimensions")
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(vector, body.encoding_format)}
        for i, vector in enumerate(vectors)
    ]
    return {
        "object": "list",
        "data": data,
        "model": lease.model_id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _split_usage(outputs: list[Any], texts: list[str]) -> tuple[list[list[float]], int]:
    """Backend outputs -> (vectors, total tokens); words where the backend gave plain vectors."""
    if all(isinstance(o, dict) and "embedding" in o for o in outputs):
        return [o["embedding"] for o in outputs], sum(int(o["tokens"]) for o in outputs)
    return list(outputs), sum(len(text.split()) for text in texts)


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector
