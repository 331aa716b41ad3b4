"""What every Ray call of the ingress shares: the per-HTTP-request context the calls carry, and
the mapping of Ray's errors to the errors the routes already understand.

A replica or engine that died -> EngineDeadError (503), Serve's back-pressure ->
EngineOverloadedError (429), the replica's own errors unwrapped. The session header and
X-Request-ID of the HTTP request reach the calls through `CALL_CONTEXT`, set per request by
`SessionContextMiddleware` (ray_serve.py, the outermost ASGI layer of the ingress).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import NoReturn

from modelyard.engine.client.protocol import (
    EngineDeadError,
    EngineOverloadedError,
    PromptTooLongError,
)
from modelyard.manager.base import ModelLoadError, ModelNotFoundError, ModelUnavailableError


@dataclass(frozen=True, slots=True)
class CallContext:
    """Per-HTTP-request values the Ray calls carry."""

    session_id: str | None = None
    request_id: str | None = None


CALL_CONTEXT: ContextVar[CallContext | None] = ContextVar("modelyard_ray_call", default=None)

#: Replica-side errors that keep their type across Ray.
_PASS_THROUGH = (
    EngineDeadError,
    EngineOverloadedError,
    PromptTooLongError,
    ModelNotFoundError,
    ModelLoadError,
    ModelUnavailableError,
    ValueError,
    TypeError,
)


def reraise_local(exc: Exception, *, llm: bool) -> NoReturn:
    """Raise `local_error(exc)` (chained to `exc` when it is another exception)."""
    error = local_error(exc, llm=llm)
    if error is exc:
        raise exc
    raise error from exc


def local_error(exc: BaseException, *, llm: bool) -> BaseException:
    """The error a route handler understands for an exception raised by a Ray call."""
    from ray import exceptions as ray_errors
    from ray.serve import exceptions as serve_errors

    if isinstance(exc, ray_errors.RayTaskError):
        cause = exc.cause
        if isinstance(cause, _PASS_THROUGH):
            return cause
        exc = cause if isinstance(cause, BaseException) else exc
    if isinstance(exc, serve_errors.BackPressureError):
        return EngineOverloadedError(f"all replicas are busy: {exc}", retry_after_s=1.0)
    if isinstance(exc, _PASS_THROUGH):
        return exc
    if isinstance(exc, ray_errors.RayError):
        message = f"replica failed: {type(exc).__name__}: {exc}"
        return EngineDeadError(message) if llm else ModelUnavailableError(message, 5.0)
    return exc
