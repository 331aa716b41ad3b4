"""The errors an engine client raises, shared by the client modules (imported by name from
engine.client.protocol too)."""

from __future__ import annotations


class EngineDeadError(RuntimeError):
    """The engine worker died or stopped answering; every in-flight request gets this."""


class EngineOverloadedError(RuntimeError):
    """The engine's bounded waiting queue is full (by requests or by prompt tokens)."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PromptTooLongError(ValueError):
    """prompt tokens + max_tokens exceed the model's context (or the prompt alone does)."""


class MissingCapabilityError(ValueError):
    """The model's engine lacks a feature the request needs (HTTP 400 naming it)."""

    def __init__(self, model: str, feature: str) -> None:
        super().__init__(f"model {model!r} does not support {feature}")
        self.model = model
        self.feature = feature
