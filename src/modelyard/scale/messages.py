"""What crosses from the ingress to an LLM replica (pickled by Ray).

The request router (ray_router.py) reads the first argument of every call: `LLMCall` and
`PinCall` are routed by their prompt's prefix. Unpinning a prefix and dropping an adapter are
broadcasts to every replica (`LLMServer.unpin`, `LLMServer.drop_loras`).
"""

from __future__ import annotations

from dataclasses import dataclass

from modelyard.engine.messages import LoRARequest, PinPrefix
from modelyard.engine.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class LLMCall:
    """One engine request, sent by the ingress's `RayLLMClient` to `LLMServer.generate`.

    The prompt is already tokenized (and length-checked) in the ingress, so the request router
    can hash its leading blocks without a tokenizer of its own."""

    request_id: str  # the engine request id (unique, made by the ingress)
    prompt_token_ids: list[int]  # the whole prompt, chat template applied
    params: SamplingParams  # validated in the ingress
    priority: int = 0  # engine priority (tenant priority + request priority)
    session_id: str | None = None  # the session header's value: sticky routing
    client_request_id: str | None = None  # the HTTP request's X-Request-ID, for the logs
    lora: LoRARequest | None = None  # the adapter it runs with; the engine loads it on demand


@dataclass(frozen=True, slots=True)
class PinCall:
    """Pin a prefix in the engine of the replica its prefix is routed to (`LLMServer.pin`)."""

    command: PinPrefix  # the engine's pin command, made by the ingress's EnginePrefixes


@dataclass(frozen=True, slots=True)
class LLMReplicaInfo:
    """What an LLM replica tells the ingress about itself (`LLMServer.describe`)."""

    model_id: str  # catalog id
    max_model_len: int  # context length
    block_size: int  # KV block size (what the router hashes by)
    tokenizer: object  # the Hugging Face tokenizer (pickled)
    replica_id: str  # Serve's replica id
    node_id: str  # the Ray node it runs on
    engine_pid: int | None  # the engine worker's process id
    max_pinned_blocks: int = 0  # the engine's pin budget, KV blocks
