"""A truthful OpenAPI document: every operation lists the statuses it can answer with, and the
body of each.

FastAPI documents 200 and its own 422, which the server never sends (a validation error is a
400 in the protocol's envelope). `install_openapi(app)` rewrites the generated document once,
from the rules below, so no route decorator has to repeat them:

- errors come in the protocol's envelope: `OpenAIError` (`{"error": {"message", "type", "param",
  "code"}}`) everywhere but under /v2, where it is `KServeError` (`{"error": "<message>"}`);
- every operation that takes parameters or a body: 400 (bad input) and 413 (body too large);
- every operation outside the gateway's open paths: 401 / 403 / 429 / 503 when the gateway is
  on (credentials, allow-lists, quotas, the limit store);
- an operation that names a model: 404 (unknown model) and 503 (not loadable now, Retry-After);
- generating text, or running a model: 429 (engine queue full), 500 (the model failed this very
  request; others are not affected) and 504 (the request timed out);
- the few bodies of their own (readiness answers) and the SSE streams (`text/event-stream`);
- the request bodies of the routes that read them by hand (/predict, /v2 infer).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from modelyard.backends.tensors import DATATYPES
from modelyard.gateway.config import DEFAULT_OPEN_PATHS

_DESCRIPTIONS = {
    400: "Bad input: a field is missing, of the wrong type or out of range",
    401: "Missing or invalid credentials (gateway on)",
    403: "The key may not use this model or route (gateway on)",
    404: "No such model (or route)",
    413: "Request body too large",
    429: "Quota used up, or the engine's queue is full (Retry-After)",
    500: "The model failed this request (other requests are not affected)",
    503: "Not available now: model loading or unloadable, rate-limit store down (Retry-After)",
    504: "The request timed out",
    507: "No room left in the model's budget for pinned prefixes",
}
_OPENAI_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "integer", "null"]},
            },
        }
    },
}
_KSERVE_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}},
}
_STATUS_BODY = {  # /ready
    "type": "object",
    "required": ["status"],
    "properties": {
        "status": {"type": "string"},
        "error": {"type": "string"},
        "kernels": {  # the runner's native kernels (runner.kernel_config.KernelState)
            "type": ["object", "null"],
            "properties": {
                "kind": {"type": "string"},
                "source": {"type": "string"},
                "error": {"type": ["string", "null"]},
            },
        },
    },
}
_READY_BODY = {  # /v2/health/ready
    "type": "object",
    "required": ["ready"],
    "properties": {"ready": {"type": "boolean"}},
}
_MODEL_READY_BODY = {  # /v2/models/{name}/ready
    "type": "object",
    "required": ["name", "ready"],
    "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}},
}
_SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {"type": "string", "description": "a JSON object, or [DONE] last"},
        "event": {"type": "string"},
    },
}
_TENSOR = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "datatype": {"type": "string", "enum": sorted(DATATYPES)},
        "parameters": {"type": "object"},
        "data": {"description": "values, flat or nested row-major"},
    },
}
_INFER_REQUEST = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": {"type": "object"},
        "inputs": {
            "type": "array",
            "minItems": 1,
            "items": {"$ref": "#/components/schemas/Tensor"},
        },
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}},
            },
        },
    },
}
_PREDICT_REQUEST = {
    "type": "object",
    "required": ["model_id", "input_data"],
    "properties": {
        "model_id": {"type": "string", "description": "model id, name or alias"},
        "input_data": {"description": "a text, an image (base64), named tensors, or a list"},
        "options": {"type": "object", "description": "top_k, labels"},
    },
}
_PREDICT_FORM = {
    "type": "object",
    "required": ["model_id", "file"],
    "properties": {
        "model_id": {"type": "string"},
        "file": {"type": "array", "items": {"type": "string", "format": "binary"}},
        "options": {"type": "string", "description": "a JSON object"},
    },
}
#: Operations that run a model (generation, inference, pinning a prefix): POSTs to these paths.
_RUNS_A_MODEL = re.compile(
    r"^(/v1/(chat/completions|completions|responses|embeddings|prefixes)|/basic_generate|/generate|"
    r"/generate_stream|/predict|/v2/models/\{name\}(/versions/\{version\})?/infer)$"
)
#: Operations that name a model (in the body, the path or the query).
_NAMES_A_MODEL = re.compile(r"^(/v2/models/|/v2/repository/models/|/debug/engine_stats$)")
_STREAMS = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/generate_stream"}
_OWN_BODIES: dict[tuple[str, str, int], dict[str, Any]] = {
    ("get", "/ready", 200): _STATUS_BODY,
    ("get", "/ready", 503): _STATUS_BODY,
    ("get", "/v2/health/ready", 200): _READY_BODY,
    ("get", "/v2/health/ready", 503): _READY_BODY,
    ("get", "/v2/models/{name}/ready", 200): _MODEL_READY_BODY,
    ("get", "/v2/models/{name}/ready", 400): _MODEL_READY_BODY,
    ("get", "/v2/models/{name}/versions/{version}/ready", 200): _MODEL_READY_BODY,
    ("get", "/v2/models/{name}/versions/{version}/ready", 400): _MODEL_READY_BODY,
}
_EXTRA_STATUSES = {
    ("get", "/ready"): {503},
    ("get", "/v2/health/ready"): {503},
    ("post", "/generate_vllm"): {503},
    ("get", "/v2/models/{name}/ready"): {400},
    ("get", "/v2/models/{name}/versions/{version}/ready"): {400},
    ("get", "/v2/models/{name}"): {400},
    ("get", "/v2/models/{name}/versions/{version}"): {400},
    ("post", "/v1/prefixes"): {507},  # the pin budget is full
    ("get", "/v1/prefixes/{prefix_id}"): {404},
    ("post", "/v1/responses"): {404},  # an unknown previous_response_id
    ("get", "/v1/responses/{response_id}"): {404},
    ("delete", "/v1/prefixes/{prefix_id}"): {404},
    # no agent index (404); or the status of one of the agent's own model calls
    ("post", "/v1/agent/ask"): {404, 500, 504, 507},
    ("post", "/v1/load_lora_adapter"): {404},  # an unknown base
    ("post", "/v1/unload_lora_adapter"): {404},  # an adapter not loaded
}


def install_openapi(app: FastAPI) -> None:
    """Make `app.openapi()` return the truthful document (built once, on first use)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes)
            app.openapi_schema = truthful(document)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def truthful(document: dict[str, Any]) -> dict[str, Any]:
    """The document with every operation's statuses and bodies (see the module docstring)."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas.update(
        OpenAIError=_OPENAI_ERROR,
        KServeError=_KSERVE_ERROR,
        Tensor=_TENSOR,
        InferenceRequest=_INFER_REQUEST,
        PredictRequest=_PREDICT_REQUEST,
    )
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            _document_operation(method, path, operation)
    return document


def _document_operation(method: str, path: str, operation: dict[str, Any]) -> None:
    _document_request_body(method, path, operation)
    responses = operation.setdefault("responses", {})
    responses.pop("422", None)
    error = "KServeError" if path == "/v2" or path.startswith("/v2/") else "OpenAIError"
    for status in sorted(statuses(method, path, operation)):
        own = _OWN_BODIES.get((method, path, status))
        schema = own if own is not None else {"$ref": f"#/components/schemas/{error}"}
        if status == 200:
            _document_success(path, responses, own)
            continue
        responses[str(status)] = {
            "description": _DESCRIPTIONS.get(status, "See the body"),
            "content": {"application/json": {"schema": schema}},
        }


def statuses(method: str, path: str, operation: dict[str, Any]) -> set[int]:
    """Every status the operation can answer with."""
    found = {200} | _EXTRA_STATUSES.get((method, path), set())
    if operation.get("parameters") or operation.get("requestBody") or method == "post":
        found |= {400, 413}
    if path not in DEFAULT_OPEN_PATHS:
        found |= {401, 403, 429, 503}
    runs_a_model = method == "post" and _RUNS_A_MODEL.match(path) is not None
    if _NAMES_A_MODEL.match(path) or runs_a_model:
        found |= {404, 503}
    if runs_a_model:
        found |= {429, 500, 504}
    return found


def _document_success(path: str, responses: dict[str, Any], own: dict[str, Any] | None) -> None:
    success = responses.setdefault("200", {"description": "Successful Response"})
    content = success.setdefault("content", {"application/json": {"schema": {}}})
    if own is not None:
        content["application/json"] = {"schema": own}
    if path in _STREAMS:
        content["text/event-stream"] = {"schema": _SSE_EVENT}  # (before 3.2: one event)
    if path == "/generate_stream":
        content.pop("application/json", None)


def _document_request_body(method: str, path: str, operation: dict[str, Any]) -> None:
    if method != "post" or "requestBody" in operation:
        return
    if path == "/predict":
        operation["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/PredictRequest"}},
                "multipart/form-data": {"schema": _PREDICT_FORM},
            },
        }
    elif path.endswith("/infer"):
        operation["requestBody"] = {
            "required": True,
            "description": "JSON, or Triton's binary extension (Inference-Header-Content-Length)",
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/InferenceRequest"}}
            },
        }
