"""Error envelopes shared by every route, and the exception handlers that produce them.

Every failure leaves the server as a JSON body in the protocol's own envelope:

- OpenAI (`/v1/*`) and the textbook endpoints: `{"error": {"message", "type", "param", "code"}}`;
- KServe v2 (`/v2/*`): `{"error": "<message>"}`

(both built by `modelyard.error_envelopes`).

`APIError` carries status, OpenAI type, param and Retry-After; `api_error_from_exception` maps
engine, manager and validation errors onto it, so a route only raises and never formats. Bad
input is always a 4xx, never a 500. The handlers answer the exceptions they know where they
are raised; any other exception, from a route or a middleware, is answered by the outermost
middleware (api.middleware.LastResortMiddleware, with the same mapping), so none leaves the app.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from modelyard.engine.client.protocol import (
    EngineDeadError,
    EngineOverloadedError,
    MissingCapabilityError,
    PromptTooLongError,
)
from modelyard.engine.sampling_params import InvalidParamError
from modelyard.error_envelopes import error_body
from modelyard.gateway.errors import GatewayError
from modelyard.manager.base import (
    ModelLoadError,
    ModelNotFoundError,
    ModelUnavailableError,
    RequestFailedError,
)

log = logging.getLogger(__name__)

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    499: "client_closed_request",
    500: "internal_server_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class APIError(Exception):
    """An error with its HTTP status; rendered in the envelope of the route's protocol."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,  # OpenAI error type; derived from the status when None
        param: str | None = None,  # the offending request field, when one is to blame
        code: str | None = None,  # a short machine-readable code
        retry_after_s: float | None = None,  # sent as Retry-After (429/503)
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPE_BY_STATUS.get(status, "api_error")
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def body(self, path: str = "") -> dict[str, Any]:
        """The envelope of the protocol served under `path` (default: OpenAI's, which the
        textbook endpoints and SSE error events use too)."""
        return error_body(path, self.message, type=self.type, param=self.param, code=self.code)

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


class ClientDisconnectedError(Exception):
    """The client went away before the response was sent; nothing is left to answer."""


def error_response(path: str, error: APIError) -> JSONResponse:
    return JSONResponse(error.body(path), status_code=error.status, headers=error.headers())


#: The request field that holds the prompt, per route (a context overflow names it).
_PROMPT_PARAM = {"/v1/chat/completions": "messages", "/generate": "prompts"}
_FIELD_MESSAGE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*) (?:must |is required)")


def param_from_value_error(message: str) -> str | None:
    """The field a plain ValueError names, when it reads "<field> must ..." or "<field> is
    required" (InvalidParamError carries its field; other messages name none)."""
    match = _FIELD_MESSAGE.match(message)
    return match.group(1) if match else None


def api_error_from_exception(exc: BaseException, path: str = "") -> APIError:
    """Map any exception a route can meet onto an APIError (unknown ones become a 500);
    `path` is the request's, for errors whose field depends on the route."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, GatewayError):
        return _from_gateway(exc)
    if isinstance(exc, ClientDisconnectedError):
        return APIError(499, "client disconnected")
    if isinstance(exc, ValueError):
        return _bad_input(exc, path)
    if isinstance(exc, ModelNotFoundError):
        return APIError(
            404, _message(exc, "model not found"), param="model", code="model_not_found"
        )
    if isinstance(exc, EngineOverloadedError):
        return APIError(429, str(exc), code="overloaded", retry_after_s=exc.retry_after_s)
    if isinstance(exc, ModelUnavailableError):
        return APIError(503, str(exc), code="model_unavailable", retry_after_s=exc.retry_after_s)
    if isinstance(exc, ModelLoadError):
        return APIError(
            503, f"model failed to load: {exc}", code="model_load_failed", retry_after_s=5
        )
    if isinstance(exc, EngineDeadError):
        return APIError(503, f"engine unavailable: {exc}", code="engine_dead", retry_after_s=5)
    if isinstance(exc, TimeoutError):
        return APIError(504, "request timed out", code="timeout")
    if isinstance(exc, RequestFailedError):
        return request_failed(str(exc))
    log.exception("unhandled error", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}")


def request_failed(error: str) -> APIError:
    """The model failed on this very request (it passed every check; its batch-mates went on):
    a 500 that says so, from an engine error output or a worker's failed batch."""
    return APIError(500, f"request failed: {error}", code="request_failed")


def _bad_input(exc: ValueError, path: str) -> APIError:
    """A 400 naming the field: the route's prompt field for a context overflow."""
    if isinstance(exc, MissingCapabilityError):
        return APIError(400, str(exc), param="model", code="unsupported_feature")
    if isinstance(exc, PromptTooLongError):
        param = _PROMPT_PARAM.get(path, "prompt")
        return APIError(400, str(exc), param=param, code="context_length_exceeded")
    if isinstance(exc, InvalidParamError):
        return APIError(400, str(exc), param=exc.param)
    return APIError(400, str(exc), param=param_from_value_error(str(exc)))


def _from_gateway(exc: GatewayError) -> APIError:
    """The request path's refusals (403 allow-list / scope, 429 quota, 503 store down...)."""
    retry = next((v for k, v in exc.headers if k.lower() == "retry-after"), None)
    return APIError(
        exc.status,
        exc.message,
        type=exc.err_type,
        param=exc.param,
        code=exc.code,
        retry_after_s=float(retry) if retry is not None else None,
    )


@contextmanager
def parsing_request(param: str | None = None) -> Iterator[None]:
    """Around a route's own request parsing: an exception no check foresaw is the request's
    fault, so it becomes a 400 naming `param` (the fallback; every known case has its check)."""
    try:
        yield
    except (APIError, ValueError):
        raise
    except Exception as exc:
        log.warning("unforeseen error while parsing a request", exc_info=exc)
        raise APIError(400, f"invalid request: {type(exc).__name__}: {exc}", param=param) from exc


def _message(exc: BaseException, default: str) -> str:
    text = str(exc)
    return text.strip("'\"") if text else default


def validation_error(exc: RequestValidationError) -> APIError:
    """A pydantic/JSON error as a 400 naming the field (OpenAI answers 400, not FastAPI's 422)."""
    errors = exc.errors()
    if not errors:
        return APIError(400, "invalid request")
    first = errors[0]
    loc = [str(part) for part in first.get("loc", ()) if _is_field(part)]
    param = ".".join(loc) or None
    message = str(first.get("msg", "invalid value"))
    if first.get("type") == "json_invalid":
        return APIError(400, f"request body is not valid JSON: {message}")
    return APIError(400, f"{param}: {message}" if param else message, param=param)


_TYPE_TAGS = frozenset({"body", "str", "int", "float", "bool", "list", "dict", "none"})


def _is_field(part: object) -> bool:
    """A field name or index of an error location, not pydantic's tag of a union member
    ("str", "list[str]", "function-after[...]") nor FastAPI's "body"."""
    if isinstance(part, int):
        return True
    text = str(part)
    return text not in _TYPE_TAGS and "[" not in text and "-" not in text


def install_exception_handlers(app: FastAPI) -> None:
    """Every error type becomes its envelope; registered once by build_app."""

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, RequestValidationError):  # pragma: no cover - registration
            raise exc
        return error_response(request.url.path, validation_error(exc))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        if not isinstance(exc, StarletteHTTPException):  # pragma: no cover - registration
            raise exc
        error = APIError(exc.status_code, str(exc.detail))
        response = error_response(request.url.path, error)
        for key, value in (exc.headers or {}).items():
            response.headers[key] = value
        return response

    async def on_any(request: Request, exc: Exception) -> JSONResponse:
        return error_response(request.url.path, api_error_from_exception(exc, request.url.path))

    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    for exc_type in (
        APIError,
        GatewayError,
        ClientDisconnectedError,
        PromptTooLongError,
        ModelNotFoundError,
        ModelLoadError,
        ModelUnavailableError,
        EngineOverloadedError,
        EngineDeadError,
        TimeoutError,
        ValueError,
    ):
        app.add_exception_handler(exc_type, on_any)
