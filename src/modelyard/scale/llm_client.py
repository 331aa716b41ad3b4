"""`RayLLMClient`: the ingress's engine client of one catalog LLM, over its Ray Serve deployment.

It offers what `AsyncLLM` offers the routes, so they need no Ray branch:

- `generate` tokenizes in the ingress and streams `RequestOutput`s from a replica the request
  router picks (ray_router.py); with `lora` the call carries the adapter and the replica's
  engine loads it on first use (the router keys an adapter's requests by the adapter, so they
  go where its weights already are);
- structured output: the call's `SamplingParams.constraint` (a picklable msgspec value, already
  compiled once without a tokenizer by the route for its 400s) rides in the `LLMCall`; the
  replica's engine compiles it against its tokenizer and masks every step, as in local mode;
- `drop_loras` broadcasts the drop to every replica (an adapter may be loaded in several);
- `prefixes` pins, lists and releases prefixes through the same `EnginePrefixes` as local mode,
  over `RayPinTransport` (pins.py): a pin goes to the replica the router sends its prefix to.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

from modelyard.engine.client.chat_template import render_chat
from modelyard.engine.client.output_processor import check_prompt_length
from modelyard.engine.client.prefixes import EnginePrefixes, PrefixRegistry
from modelyard.engine.client.protocol import (
    ChatMessageDict,
    EngineCapabilities,
    RequestOutput,
    Tokenizer,
)
from modelyard.engine.messages import LoRARequest, SchedulerStats
from modelyard.engine.sampling_params import SamplingParams
from modelyard.scale.calls import CALL_CONTEXT, CallContext, reraise_local
from modelyard.scale.messages import LLMCall, LLMReplicaInfo
from modelyard.scale.pins import RayPinTransport


class RayLLMClient:
    """`LLMClient` over an LLM deployment (see the module docstring): LoRA, pins, tools and
    structured output, as local mode serves them."""

    capabilities = EngineCapabilities(lora=True, pins=True, structured_output=True, tools=True)

    def __init__(self, handle: Any, info: LLMReplicaInfo) -> None:
        self._plain = handle
        self._handle = handle.options(stream=True)
        self._info = info
        self._live: dict[str, Any] = {}  # request id -> the response generator
        self._prefixes: EnginePrefixes | None = None

    @property
    def model_name(self) -> str:
        return self._info.model_id

    @property
    def max_model_len(self) -> int:
        return self._info.max_model_len

    @property
    def tokenizer(self) -> Tokenizer:
        return cast(Tokenizer, self._info.tokenizer)

    @property
    def pid(self) -> None:
        """The engines run in the replicas' processes, not here."""
        return None

    @property
    def holds_pinned_prefixes(self) -> bool:
        return self._prefixes is not None and bool(self._prefixes.list())

    @property
    def is_alive(self) -> bool:
        return True  # Serve replaces dead replicas; a failed call raises EngineDeadError

    @property
    def prefixes(self) -> EnginePrefixes:
        """The pinned prefixes of this deployment's replicas (pins.py). The pin budget is one
        replica's, counted over the pins of every replica."""
        if self._prefixes is None:
            registry = PrefixRegistry(
                model=self._info.model_id,
                block_size=self._info.block_size,
                max_pinned_blocks=self._info.max_pinned_blocks,
                max_model_len=self._info.max_model_len,
            )
            transport = RayPinTransport(self._plain, self._info.block_size)
            self._prefixes = EnginePrefixes(transport, registry)
        return self._prefixes

    def apply_chat_template(
        self, messages: Sequence[ChatMessageDict], tools: Sequence[ChatMessageDict] | None = None
    ) -> list[int]:
        return render_chat(self.tokenizer, messages, tools)

    async def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str,
        *,
        priority: int = 0,
        lora: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        params.validate()
        ids = await self._tokenize(prompt)
        check_prompt_length(len(ids), params.max_tokens, self.max_model_len)
        context = CALL_CONTEXT.get() or CallContext()
        call = LLMCall(
            request_id=request_id,
            prompt_token_ids=ids,
            params=params,
            priority=priority,
            session_id=context.session_id,
            client_request_id=context.request_id,
            lora=lora,
        )
        stream = self._handle.generate.remote(call)
        self._live[request_id] = stream
        finished = False
        try:
            async for output in stream:
                finished = output.finished
                yield output
        except Exception as exc:
            reraise_local(exc, llm=True)
        finally:
            self._live.pop(request_id, None)
            if not finished:
                stream.cancel()

    async def abort(self, request_id: str) -> None:
        stream = self._live.pop(request_id, None)
        if stream is not None:
            stream.cancel()

    async def drop_loras(self, names: list[str]) -> None:
        """Unregistered adapters: every replica's engine frees them (a replica that died has
        nothing to free, so its error is ignored)."""
        try:
            response = self._plain.broadcast("drop_loras", list(names))
            await response.results_async(return_exceptions=True)
        except Exception as exc:
            reraise_local(exc, llm=True)

    def stats(self) -> SchedulerStats:
        """Engine stats live in each replica (Ray's metrics export); none in the ingress."""
        return SchedulerStats()

    async def shutdown(self) -> None:
        for stream in self._live.values():
            stream.cancel()

    async def _tokenize(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = await asyncio.to_thread(self.tokenizer.encode, prompt)
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("prompt must not be empty")
        return ids
