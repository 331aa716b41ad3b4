from __future__ import annotations

import asyncio

import pytest
from manager_fakes import MB, FakeLoader, make_catalog

from modelyard.manager.base import ModelLoadError, ModelNotFoundError, ModelUnavailableError
from modelyard.manager.config import ManagerConfig
from modelyard.manager.entries import State
from modelyard.manager.manager import Manager
from modelyard.observability import metrics

pytestmark = pytest.mark.unit


def manager_for(loader: FakeLoader, *ids: str, budget: int = 250 * MB, **kw: object) -> Manager:
    overrides = kw.pop("overrides", {})
    config = ManagerConfig(memory_budget_bytes=budget, **kw)  # type: ignore[arg-type]
    return Manager(make_catalog(*ids, **overrides), config, loader=loader)  # type: ignore[arg-type]


async def use(manager: Manager, name: str) -> None:
    async with manager.lease(name) as lease:
        assert await lease.predictor.predict(["x"]) == [f"{lease.model_id}:x"]


def loaded_ids(manager: Manager) -> set[str]:
    return {m["id"] for m in manager.describe()["loaded_models"]}


async def test_textbook_lru_scenario_budget_for_two(loader: FakeLoader) -> None:
    manager = manager_for(loader, "a", "b", "c")
    for name in ("a", "b", "a", "c"):
        await use(manager, name)
    assert loaded_ids(manager) == {"a", "c"}
    assert loader.models["b"].stopped
    assert loader.loads == ["a", "b", "c"]
    assert manager.stats["hits"] == 1
    assert manager.stats["evictions"] == 1
    await manager.close()


async def test_max_models_counts_models(loader: FakeLoader) -> None:
    manager = manager_for(loader, "a", "b", "c", budget=10_000 * MB, max_models=2)
    for name in ("a", "b", "a", "c"):
        await use(manager, name)
    assert loaded_ids(manager) == {"a", "c"}
    await manager.close()


async def test_evicts_only_as_many_as_needed_in_lru_order(loader: FakeLoader) -> None:
    loader.sizes = {"big": 200 * MB}
    overrides = {"big": {"memory_estimate_bytes": 200 * MB}}
    manager = manager_for(loader, "a", "b", "c", "big", budget=300 * MB, overrides=overrides)
    for name in ("a", "b", "c", "a"):
        await use(manager, name)
    assert loaded_ids(manager) == {"a", "b", "c"}
    await use(manager, "big")  # needs 200 MB: evicts b then c (LRU), keeps a (recently used)
    assert loaded_ids(manager) == {"a", "big"}
    await manager.close()


async def test_pinned_model_is_never_evicted(loader: FakeLoader) -> None:
    manager = manager_for(loader, "p", "b", "c", overrides={"p": {"pin": True}})
    await manager.start()
    assert loaded_ids(manager) == {"p"}
    assert manager.ready
    for name in ("b", "c", "b"):
        await use(manager, name)
    assert "p" in loaded_ids(manager)
    assert loader.loads.count("p") == 1
    await manager.close()


async def test_model_holding_pinned_prefixes_is_not_evicted_until_unpinned(
    loader: FakeLoader,
) -> None:
    manager = manager_for(loader, "llm", "b", "c")  # room for two at a time
    await use(manager, "llm")
    loader.models["llm"].holds_pins = True
    for name in ("b", "c", "b"):
        await use(manager, name)
    assert "llm" in loaded_ids(manager)  # b and c took turns beside it
    loader.models["llm"].holds_pins = False
    await use(manager, "c")
    assert "llm" not in loaded_ids(manager)
    await manager.close()


async def test_single_flight_twenty_concurrent_cold_leases_one_load() -> None:
    loader = FakeLoader(delay=0.05)
    manager = manager_for(loader, "a")
    before = metrics.MODEL_LOADS.labels("a")._value.get()
    await asyncio.gather(*(use(manager, "a") for _ in range(20)))
    assert loader.loads == ["a"]
    assert manager.stats["loads"] == 1
    assert manager.stats["misses"] == 20
    assert metrics.MODEL_LOADS.labels("a")._value.get() - before == 1
    await manager.close()


async def test_failed_load_evicts_nothing_when_it_fits(loader: FakeLoader) -> None:
    loader.failing = {"bad"}
    manager = manager_for(loader, "a", "bad", budget=300 * MB)
    await use(manager, "a")
    with pytest.raises(ModelLoadError, match="cannot load bad"):
        await use(manager, "bad")
    assert loaded_ids(manager) == {"a"}
    assert not loader.models["a"].stopped
    assert manager.describe()["memory"]["reserved_bytes"] == 0
    await manager.close()


async def test_failed_load_backs_off_then_retries(loader: FakeLoader) -> None:
    loader.failing = {"bad"}
    manager = manager_for(loader, "bad", retry_backoff_s=0.2)
    with pytest.raises(ModelLoadError):
        await use(manager, "bad")
    with pytest.raises(ModelLoadError, match="next retry"):
        await use(manager, "bad")
    assert loader.loads == ["bad"]  # no second attempt during the backoff
    loader.failing.clear()
    await asyncio.sleep(0.25)
    await use(manager, "bad")
    assert loader.loads == ["bad", "bad"]
    assert manager.state("bad") is State.LOADED
    await manager.close()


async def test_lease_blocks_eviction_then_waits_for_memory(loader: FakeLoader) -> None:
    manager = manager_for(loader, "a", "b", "c", wait_timeout_s=2.0)
    async with manager.lease("a"), manager.lease("b"):
        waiter = asyncio.create_task(use(manager, "c"))
        await asyncio.sleep(0.05)
        assert not waiter.done()  # both loaded models are leased: c waits
        assert loaded_ids(manager) == {"a", "b"}
    await waiter  # the leases ended: a (LRU) is evicted, c loads
    assert "c" in loaded_ids(manager)
    await manager.close()


async def test_wait_for_memory_times_out_with_503(loader: FakeLoader) -> None:
    manager = manager_for(loader, "a", "b", "c", wait_timeout_s=0.1)
    async with manager.lease("a"), manager.lease("b"):
        with pytest.raises(ModelUnavailableError):
            await use(manager, "c")
    await manager.close()


async def test_model_larger_than_budget_fails_without_evicting(loader: FakeLoader) -> None:
    overrides = {"huge": {"memory_estimate_bytes": 10_000 * MB}}
    manager = manager_for(loader, "a", "huge", overrides=overrides)
    await use(manager, "a")
    with pytest.raises(ModelLoadError, match="budget"):
        await use(manager, "huge")
    assert loaded_ids(manager) == {"a"}
    await manager.close()


async def test_keep_alive_unloads_idle_models(loader: FakeLoader) -> None:
    overrides = {"a": {"keep_alive_s": 0.1}}
    manager = manager_for(loader, "a", "b", sweep_interval_s=0.05, overrides=overrides)
    await manager.start()
    await use(manager, "a")
    await use(manager, "b")
    await asyncio.sleep(0.4)
    assert loaded_ids(manager) == {"b"}
    assert loader.models["a"].stopped
    await manager.close()


async def test_crashed_model_reloads_on_next_lease(loader: FakeLoader) -> None:
    manager = manager_for(loader, "a", "b")
    await use(manager, "a")
    loader.models["a"].alive = False
    await use(manager, "a")
    assert loader.loads == ["a", "a"]
    await use(manager, "b")  # the crashed worker's bytes were returned to the budget
    assert loaded_ids(manager) == {"a", "b"}
    await manager.close()


async def test_measured_memory_replaces_estimate(loader: FakeLoader) -> None:
    loader.sizes = {"a": 42 * MB}
    manager = manager_for(loader, "a")
    await use(manager, "a")
    assert manager.describe()["loaded_models"][0]["memory_bytes"] == 42 * MB
    await manager.close()


async def test_loading_a_never_delays_a_loaded_b() -> None:
    loader = FakeLoader()
    manager = manager_for(loader, "slow", "b")
    await use(manager, "b")
    loader.delay = 1.0
    slow = asyncio.create_task(use(manager, "slow"))
    await asyncio.sleep(0.01)
    started = asyncio.get_running_loop().time()
    await use(manager, "b")
    assert asyncio.get_running_loop().time() - started < 0.2
    await slow
    await manager.close()


async def test_unknown_model_and_explicit_unload_frees_the_budget(loader: FakeLoader) -> None:
    manager = manager_for(loader, "a", "b", "c")
    with pytest.raises(ModelNotFoundError):
        await use(manager, "nope")
    await manager.load("a")
    await manager.unload("a")
    assert loaded_ids(manager) == set()
    assert manager.state("a") is State.UNLOADED
    await use(manager, "b")
    await use(manager, "c")  # fits without evicting b: the unloaded a's bytes came back
    assert loaded_ids(manager) == {"b", "c"}
    assert manager.stats["evictions"] == 1  # only the explicit unload
    await manager.close()


async def test_lease_kind_guards(loader: FakeLoader) -> None:
    manager = manager_for(loader, "a")
    async with manager.lease("a") as lease:
        with pytest.raises(TypeError):
            _ = lease.llm
    await manager.close()
