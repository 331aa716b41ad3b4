"""vLLM's runtime LoRA API: `POST /v1/load_lora_adapter`, `POST /v1/unload_lora_adapter`.

- load {lora_name, lora_path, base_model?}: checks the PEFT folder against the base model's
  shapes (in a thread) and registers the adapter as a model id (api.lora); the engine reads the
  weights on first use. `base_model` may be left out when exactly one catalog LLM serves LoRA.
  400 for a taken name or an adapter that does not fit, 404 for an unknown base.
- unload {lora_name}: unregisters it (404 if unknown); a loaded base engine frees its memory
  once no running request uses it.
Both answer vLLM's plain-text success messages. They name server-side folders, so they need the
admin scope (the gateway's `require_admin`; with auth off every caller holds it).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict
from starlette.responses import PlainTextResponse

from modelyard.api.errors import APIError
from modelyard.api.lora import LoRARegistry
from modelyard.engine.config import LoRAConfig
from modelyard.engine.protocol import LoRAClient, serves_lora
from modelyard.gateway.request_path import require_admin
from modelyard.manager.base import ModelNotFoundError
from modelyard.manager.entries import State

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
    registry: LoRARegistry = request.app.state.loras
    provider = request.app.state.provider
    name = body.lora_name
    catalog = getattr(provider, "catalog", None)
    if not name or registry.get(name) is not None or (catalog is not None and name in catalog):
        raise APIError(400, f"the LoRA adapter {name!r} has already been loaded", param="lora_name")
    spec = _base_spec(provider, body.base_model)
    try:
        await asyncio.to_thread(_check_adapter, body.lora_path, spec)
    except ValueError as exc:
        raise APIError(400, str(exc), param="lora_path") from exc
    registry.add(name, spec.id, body.lora_path)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


@router.post("/v1/unload_lora_adapter", response_model=None)
async def unload_lora_adapter(
    body: UnloadLoRAAdapterRequest, request: Request
) -> PlainTextResponse:
    registry: LoRARegistry = request.app.state.loras
    try:
        adapter = registry.remove(body.lora_name)
    except KeyError:
        message = f"the LoRA adapter {body.lora_name!r} is not loaded"
        raise APIError(404, message, param="lora_name") from None
    provider = request.app.state.provider
    state_of = getattr(provider, "state", None)
    if state_of is not None and state_of(adapter.base) == State.LOADED:
        async with provider.lease(adapter.base) as lease:
            llm = lease.llm
            if serves_lora(llm):
                await cast(LoRAClient, llm).drop_loras([adapter.lora.name])
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


def _base_spec(provider: Any, base_model: str | None) -> Any:
    """The catalog entry of the base model (given, or the only LLM that serves LoRA)."""
    catalog = getattr(provider, "catalog", None)
    if catalog is None:
        raise APIError(400, "this server has no catalog of LLMs to put adapters on")
    if base_model is not None:
        try:
            spec = catalog.resolve(base_model)
        except ModelNotFoundError as exc:
            raise APIError(404, f"model {base_model!r} not found", param="base_model") from exc
        if not spec.kind.is_llm or _lora_config(spec) is None:
            raise APIError(400, f"model {base_model!r} serves no LoRA adapters", param="base_model")
        return spec
    candidates = [s for s in catalog if s.kind.is_llm and _lora_config(s) is not None]
    if len(candidates) != 1:
        raise APIError(400, "name the base_model: it must be an LLM that serves LoRA adapters")
    return candidates[0]


def _lora_config(spec: Any) -> LoRAConfig | None:
    return LoRAConfig.from_options(spec.options, f"models.{spec.id}.options")


def _check_adapter(path: str, spec: Any) -> None:
    """Read the adapter against the base's shapes (ValueError when it does not fit)."""
    from pathlib import Path

    import torch

    from modelyard.engine.messages import LoRARequest
    from modelyard.runner.loader import resolve_model
    from modelyard.runner.lora import BaseShapes, read_adapter

    if not (Path(path) / "adapter_config.json").is_file():
        raise ValueError(f"no PEFT adapter (adapter_config.json) at {path!r}")
    config = resolve_model(spec.source).config
    lora = LoRARequest(name="check", path=path, adapter_id=0)
    lora_config = _lora_config(spec)
    max_rank = lora_config.max_lora_rank if lora_config is not None else 0
    read_adapter(lora, BaseShapes.of(config), max_rank, torch.float32)
