"""vLLM's runtime LoRA API: `POST /v1/load_lora_adapter`, `POST /v1/unload_lora_adapter`.

- load {lora_name, lora_path, base_model?}: checks the PEFT folder (under `server.lora_root`
  when set; read against the base model's shapes, in a thread: api.lora.check_adapter) and
  registers the adapter with the model provider (`ModelProvider.add_adapter`: an entry of its
  own, locally and on Ray) with its resolved folder; the engine reads the weights on first use.
  `base_model` may be left out when exactly one catalog LLM serves LoRA. 400 for a taken name,
  a folder outside lora_root or an adapter that is malformed or does not fit (naming what is
  wrong), 404 for an unknown base.
- unload {lora_name}: `ModelProvider.remove_adapter` (404 if unknown); a loaded base engine
  frees its memory once no running request uses it.
A server whose catalog has no LLM that serves LoRA answers 400 (code `unsupported_feature`) to a
load without `base_model`: the request asks for a feature this server does not offer.
Both answer vLLM's plain-text success messages. They name server-side folders, so they need the
admin scope (the gateway's `require_admin`; with auth off every caller holds it).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict
from starlette.responses import PlainTextResponse

from modelyard.api.errors import APIError
from modelyard.api.lora import check_adapter
from modelyard.engine.config import LoRAConfig
from modelyard.gateway.request_path import provider_of, require_admin
from modelyard.manager.base import ModelNotFoundError, ModelProvider
from modelyard.model_spec import ModelSpec

router = APIRouter(dependencies=[Depends(require_admin)])


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    lora_name: str
    lora_path: str
    base_model: str | None = None  # the LLM to serve it on (a catalog name)


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    lora_name: str


@router.post("/v1/load_lora_adapter", response_model=None)
async def load_lora_adapter(body: LoadLoRAAdapterRequest, request: Request) -> PlainTextResponse:
    provider = provider_of(request)
    name = body.lora_name
    if not name or _is_taken(provider, name):
        raise APIError(400, f"the LoRA adapter {name!r} has already been loaded", param="lora_name")
    spec = _base_spec(provider, body.base_model)
    root = request.app.state.config.server.lora_root
    lora_config = _lora_config(spec)
    max_rank = lora_config.max_lora_rank if lora_config is not None else 0
    try:
        folder = await asyncio.to_thread(check_adapter, name, body.lora_path, root, spec, max_rank)
    except ValueError as exc:
        raise APIError(400, str(exc), param="lora_path") from exc
    try:
        provider.add_adapter(name, spec.id, str(folder))
    except ValueError as exc:  # the same name, loaded meanwhile
        raise APIError(400, str(exc), param="lora_name") from exc
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


@router.post("/v1/unload_lora_adapter", response_model=None)
async def unload_lora_adapter(
    body: UnloadLoRAAdapterRequest, request: Request
) -> PlainTextResponse:
    try:
        await provider_of(request).remove_adapter(body.lora_name)
    except ModelNotFoundError:
        message = f"the LoRA adapter {body.lora_name!r} is not loaded"
        raise APIError(404, message, param="lora_name") from None
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


def _is_taken(provider: ModelProvider, name: str) -> bool:
    """Whether a model, alias or adapter already has this name."""
    try:
        provider.spec(name)
    except ModelNotFoundError:
        return False
    return True


def _base_spec(provider: ModelProvider, base_model: str | None) -> ModelSpec:
    """The catalog entry of the base model (given, or the only LLM that serves LoRA)."""
    if base_model is not None:
        try:
            spec = provider.spec(base_model)
        except ModelNotFoundError as exc:
            raise APIError(404, f"model {base_model!r} not found", param="base_model") from exc
        in_catalog = spec in provider.catalog_entries()
        if not in_catalog or not spec.kind.is_llm or _lora_config(spec) is None:
            raise APIError(400, f"model {base_model!r} serves no LoRA adapters", param="base_model")
        return spec
    candidates = [
        s for s in provider.catalog_entries() if s.kind.is_llm and _lora_config(s) is not None
    ]
    if not candidates:
        raise APIError(
            400, "no model of this server serves LoRA adapters", code="unsupported_feature"
        )
    if len(candidates) != 1:
        raise APIError(400, "name the base_model: it must be an LLM that serves LoRA adapters")
    return candidates[0]


def _lora_config(spec: ModelSpec) -> LoRAConfig | None:
    return spec.llm.lora if spec.llm is not None else None
