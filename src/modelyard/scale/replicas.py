"""The classes behind the Ray Serve deployments of the models (ray_serve.py decorates them).

- `LLMServer`: one replica = one engine worker. It starts an `AsyncLLM` (the same engine worker
  process as single-node mode) and streams `RequestOutput`s for `LLMCall`s (with the call's
  LoRA adapter, which the engine loads on first use); it pins prefixes in its engine (`PinCall`)
  and, on a broadcast to every replica, unpins them and drops unregistered adapters. Serve calls
  `check_health` (the engine worker must be alive: a dead one fails the check and Serve replaces
  the replica). A small loop exports the engine's stats through Ray's metrics export, tagged by
  deployment and replica.
- `ModelPool`: the non-LLM models, multiplexed by model id (`@serve.multiplexed`, wired at init
  because the per-replica model count comes from the config). Each replica keeps today's
  byte-budget manager: Ray's multiplexer decides which replica holds a model id (and evicts by
  count), the manager loads it into a worker process within the replica's byte budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import ray
from ray import serve
from ray.serve import metrics as serve_metrics

from modelyard.engine.client.async_llm import AsyncLLM
from modelyard.engine.client.protocol import RequestOutput
from modelyard.engine.messages import EngineOutput, SchedulerStats
from modelyard.manager.catalog import Catalog
from modelyard.manager.config import ManagerConfig
from modelyard.manager.loaders import engine_config_for
from modelyard.manager.manager import Manager
from modelyard.model_spec import ModelSpec
from modelyard.scale.messages import LLMCall, LLMReplicaInfo, PinCall

log = logging.getLogger("modelyard.scale")

#: Seconds between two exports of an engine's stats to Ray's metrics.
EXPORT_INTERVAL_S = 1.0


def _replica_id() -> str:
    return str(serve.get_replica_context().replica_id.unique_id)


class LLMServer:
    """A replica of one catalog LLM (see the module docstring)."""

    async def __init__(self, spec: ModelSpec) -> None:  # type: ignore[misc]  # Serve awaits it
        self._spec = spec
        self._llm = await AsyncLLM.start(engine_config_for(spec), model_name=spec.id)
        self._exporter = asyncio.create_task(_export_engine_stats(spec.id, self._llm.stats))
        log.info("replica %s of %s ready (engine pid %s)", _replica_id(), spec.id, self._llm.pid)

    async def generate(self, call: LLMCall) -> AsyncIterator[RequestOutput]:
        """Stream one engine request (LLMClient.generate's contract; errors pickle across)."""
        log.info(
            "request %s (x-request-id %s) on replica %s",
            call.request_id,
            call.client_request_id,
            _replica_id(),
        )
        outputs = self._llm.generate(
            call.prompt_token_ids,
            call.params,
            call.request_id,
            priority=call.priority,
            lora=call.lora,
        )
        async for output in outputs:
            yield output

    async def pin(self, call: PinCall) -> AsyncIterator[EngineOutput]:
        """Prefill and pin a prefix in this replica's engine; its outputs stream back (the
        ingress's EnginePrefixes reads them as in local mode). Leaving early aborts it."""
        engine = self._llm.engine_client
        log.info("pin %s on replica %s", call.command.prefix_id, _replica_id())
        finished = False
        try:
            async for output in await engine.add_request(call.command):
                finished = output.finish_reason is not None
                yield output
        finally:
            if not finished and engine.is_alive:
                with contextlib.suppress(Exception):
                    await engine.abort([call.command.request_id])
                    await engine.unpin_prefixes([call.command.prefix_id])

    async def unpin(self, prefix_ids: list[str]) -> None:
        """Release pins (the engine ignores those it does not hold)."""
        await self._llm.engine_client.unpin_prefixes(list(prefix_ids))

    async def drop_loras(self, names: list[str]) -> None:
        """Unregistered adapters: the engine frees them once no request uses them."""
        await self._llm.drop_loras(names)

    def describe(self) -> LLMReplicaInfo:
        ready = self._llm.ready
        return LLMReplicaInfo(
            model_id=self._spec.id,
            max_model_len=ready.max_model_len,
            block_size=ready.block_size,
            tokenizer=self._llm.tokenizer,
            replica_id=_replica_id(),
            node_id=ray.get_runtime_context().get_node_id(),
            engine_pid=self._llm.pid,
            max_pinned_blocks=ready.max_pinned_blocks,
        )

    def check_health(self) -> None:
        if not self._llm.is_alive:
            raise RuntimeError(f"the engine worker of {self._spec.id} is dead")

    async def __del__(self) -> None:
        self._exporter.cancel()
        await self._llm.shutdown()


async def _export_engine_stats(model_id: str, read: Callable[[], SchedulerStats]) -> None:
    """Mirror an engine's SchedulerStats into Ray metrics (gauges and counter increments)."""
    tags = {"model": model_id}
    gauges = {
        name: serve_metrics.Gauge(f"modelyard_engine_{name}", description, tag_keys=("model",))
        for name, description in (
            ("num_requests_running", "requests the engine is stepping"),
            ("num_requests_waiting", "requests queued in the engine"),
            ("kv_cache_usage_perc", "fraction of KV blocks in use"),
        )
    }
    counters = {
        name: serve_metrics.Counter(f"modelyard_engine_{name}", description, tag_keys=("model",))
        for name, description in (
            ("prefix_cache_queries", "prompt tokens looked up in the prefix cache"),
            ("prefix_cache_hits", "prompt tokens found in the prefix cache"),
            ("num_preemptions", "requests preempted"),
        )
    }
    last = {name: 0 for name in counters}
    while True:
        stats = read()
        gauges["num_requests_running"].set(stats.num_running, tags)
        gauges["num_requests_waiting"].set(stats.num_waiting, tags)
        gauges["kv_cache_usage_perc"].set(stats.kv_cache_usage, tags)
        for name, counter in counters.items():
            value = int(getattr(stats, name))
            if value > last[name]:
                counter.inc(value - last[name], tags)
            last[name] = value
        await asyncio.sleep(EXPORT_INTERVAL_S)


class _PooledModel:
    """What Ray's multiplexer caches per model id: the model lives in the replica's manager;
    Ray's LRU eviction (by count) unloads it there. Unloading twice is harmless."""

    def __init__(self, manager: Manager, model_id: str) -> None:
        self._manager = manager
        self.model_id = model_id
        self._unloaded = False

    async def __del__(self) -> None:
        if self._unloaded:
            return
        self._unloaded = True
        with contextlib.suppress(Exception):
            await self._manager.unload(self.model_id)


class ModelPool:
    """The multiplexed deployment of the non-LLM models (see the module docstring)."""

    async def __init__(  # type: ignore[misc]  # Serve awaits it
        self, specs: list[ModelSpec], manager_config: ManagerConfig, max_models: int
    ) -> None:
        self._manager = Manager(Catalog(specs), manager_config)
        await self._manager.start()

        async def load(model_id: str) -> _PooledModel:
            await self._manager.load(model_id)
            return _PooledModel(self._manager, model_id)

        self._get_model: Callable[[str], Awaitable[_PooledModel]] = serve.multiplexed(
            max_num_models_per_replica=max_models
        )(load)

    async def predict(self, inputs: Any, options: dict[str, Any] | None) -> Any:
        """Run one request on the model named by the multiplexed model id."""
        model_id = serve.get_multiplexed_model_id()
        await self._get_model(model_id)
        async with self._manager.lease(model_id) as lease:
            return await lease.predictor.predict(inputs, options)

    async def metadata(self) -> dict[str, Any]:
        """The multiplexed model's tensor metadata (loading it if needed)."""
        model_id = serve.get_multiplexed_model_id()
        await self._get_model(model_id)
        async with self._manager.lease(model_id) as lease:
            metadata: dict[str, Any] = lease.metadata
            return metadata

    async def load(self) -> None:
        await self._get_model(serve.get_multiplexed_model_id())

    async def unload(self) -> None:
        await self._manager.unload(serve.get_multiplexed_model_id())

    async def __del__(self) -> None:
        await self._manager.close()
