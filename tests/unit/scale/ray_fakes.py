"""In-process fakes of an LLM deployment for the Ray provider tests: a handle with the calls
`RayLLMClient` makes (`.remote`, streaming responses, `broadcast`) over fake replicas, routed by
the real affinity table as the prefix-aware router routes them. No Ray cluster."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from modelyard.engine.client.protocol import CompletionDelta, RequestOutput
from modelyard.engine.messages import EngineOutput, FinishReason, LoRARequest, PinPrefix
from modelyard.scale.affinity import PrefixAffinity
from modelyard.scale.messages import LLMCall, LLMReplicaInfo, PinCall
from modelyard.scale.ray_router import routing_keys

BLOCK = 4


class CharTokenizer:
    """One token per character: id = ord(char)."""

    eos_token_id: int | None = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(t) for t in token_ids)

    def __len__(self) -> int:
        return 0x110000


@dataclass
class FakeReplica:
    """A replica's engine as the calls see it: answers `[adapter name or "base"]`, records pins,
    unpins and adapter drops; a request whose prompt starts with a pinned prefix reports the
    pin's full blocks as cached."""

    name: str
    calls: list[LLMCall] = field(default_factory=list)
    pinned: dict[str, list[int]] = field(default_factory=dict)  # prefix id -> tokens
    pin_commands: list[PinPrefix] = field(default_factory=list)
    unpinned: list[str] = field(default_factory=list)
    dropped: list[list[str]] = field(default_factory=list)

    async def generate(self, call: LLMCall) -> AsyncIterator[RequestOutput]:
        self.calls.append(call)
        text = f"[{call.lora.name if call.lora else 'base'}]"
        yield RequestOutput(
            request_id=call.request_id,
            deltas=[CompletionDelta(0, text, [1], finish_reason=FinishReason.LENGTH)],
            num_prompt_tokens=len(call.prompt_token_ids),
            num_cached_tokens=self.cached(call.prompt_token_ids, call.lora),
            num_generated_tokens=1,
            finished=True,
        )

    def cached(self, prompt: list[int], lora: LoRARequest | None) -> int:
        hits = [len(p) for p in self.pinned.values() if lora is None and prompt[: len(p)] == p]
        return max(hits, default=0) // BLOCK * BLOCK

    async def pin(self, call: PinCall) -> AsyncIterator[EngineOutput]:
        self.pinned[call.command.prefix_id] = list(call.command.token_ids)
        self.pin_commands.append(call.command)
        yield EngineOutput(
            request_id=call.command.request_id,
            new_token_ids=[],
            finish_reason=FinishReason.LENGTH,
        )

    async def unpin(self, prefix_ids: list[str]) -> None:
        for prefix_id in prefix_ids:
            if self.pinned.pop(prefix_id, None) is not None:
                self.unpinned.append(prefix_id)

    async def drop_loras(self, names: list[str]) -> None:
        self.dropped.append(list(names))


class _Stream:
    """A streaming DeploymentResponse: an async iterator with cancel()."""

    def __init__(self, outputs: AsyncIterator[Any]) -> None:
        self._outputs = outputs
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._outputs

    def cancel(self) -> None:
        self.cancelled = True


class _Broadcast:
    def __init__(self, results: list[Any]) -> None:
        self._results = results

    async def results_async(self, *, return_exceptions: bool = False) -> list[Any]:
        return await asyncio.gather(*self._results, return_exceptions=return_exceptions)


class _Method:
    def __init__(self, deployment: FakeDeployment, name: str) -> None:
        self._deployment = deployment
        self._name = name

    def remote(self, *args: Any) -> Any:
        replica = self._deployment.route(args[0])
        result = getattr(replica, self._name)(*args)
        return _Stream(result) if self._name in ("generate", "pin") else result


class FakeDeployment:
    """A DeploymentHandle of an LLM deployment over fake replicas; each call goes to the
    replica the prefix-aware router's affinity table picks (queues all empty)."""

    def __init__(self, *names: str, model_id: str = "m", max_pinned_blocks: int = 16) -> None:
        self.replicas = {name: FakeReplica(name) for name in names}
        self.affinity = PrefixAffinity()
        self.routed: list[str] = []  # replica of every call, in order
        self.info = LLMReplicaInfo(
            model_id=model_id,
            max_model_len=128,
            block_size=BLOCK,
            tokenizer=CharTokenizer(),
            replica_id=names[0],
            node_id="node",
            engine_pid=None,
            max_pinned_blocks=max_pinned_blocks,
        )

    def options(self, **_: Any) -> FakeDeployment:
        return self

    def __getattr__(self, name: str) -> Any:
        if name == "describe":
            return _Describe(self.info)
        if name in ("generate", "pin"):
            return _Method(self, name)
        raise AttributeError(name)

    def broadcast(self, method: str, *args: Any) -> _Broadcast:
        return _Broadcast([getattr(r, method)(*args) for r in self.replicas.values()])

    def route(self, call: Any) -> FakeReplica:
        keys = routing_keys(call, BLOCK, 64)
        assert keys is not None
        queues = dict.fromkeys(self.replicas, 0)
        name = self.affinity.choose(keys, queues) or next(iter(self.replicas))
        self.affinity.routed(keys, name)
        self.routed.append(name)
        return self.replicas[name]


class _Describe:
    def __init__(self, info: LLMReplicaInfo) -> None:
        self._info = info

    async def remote(self) -> LLMReplicaInfo:
        return self._info


def pin_command(prefix_id: str, tokens: list[int], ttl_s: float = 60.0) -> PinPrefix:
    return PinPrefix(
        request_id=f"pin-{prefix_id}", prefix_id=prefix_id, token_ids=tokens, ttl_s=ttl_s
    )
