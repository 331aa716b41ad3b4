"""LLM kinds: the worker is the engine; the lease hands out the LLMClient (a fake here)."""

from __future__ import annotations

from typing import Any

import pytest

from fakes.llm import FakeLLM
from modelyard.engine.config import AdmissionConfig
from modelyard.manager.catalog import Catalog
from modelyard.manager.config import ManagerConfig
from modelyard.manager.loaders import LLMModel, engine_config_for
from modelyard.manager.manager import Manager
from modelyard.model_spec import ModelKind, ModelSpec

pytestmark = pytest.mark.unit

MB = 1024 * 1024


class FakeLLMLoader:
    def __init__(self) -> None:
        self.llms: list[FakeLLM] = []

    async def load(self, spec: ModelSpec) -> Any:
        llm = FakeLLM(name=spec.id)
        self.llms.append(llm)
        return LLMModel(llm=llm, metadata={}, kind=spec.kind)  # type: ignore[arg-type]


def chat_spec(**kw: Any) -> ModelSpec:
    return ModelSpec(
        id="chat",
        kind=ModelKind.CHAT,
        backend="llm",
        source="x.gguf",
        memory_estimate_bytes=100 * MB,
        **kw,
    )


async def test_lease_gives_the_engine_and_describe_shows_its_stats() -> None:
    loader = FakeLLMLoader()
    manager = Manager(
        Catalog([chat_spec(preload=True)]),
        ManagerConfig(memory_budget_bytes=500 * MB),
        loader=loader,
    )
    await manager.start()
    assert manager.ready
    async with manager.lease("chat") as lease:
        assert lease.llm is loader.llms[0]
        with pytest.raises(TypeError):
            _ = lease.predictor
    (loaded,) = manager.describe()["loaded_models"]
    assert loaded["engine"]["num_free_blocks"] == loader.llms[0].stats().num_free_blocks == 10
    assert manager.engine_stats() == {"chat": loader.llms[0].stats()}
    await manager.close()
    assert loader.llms[0].shut


def test_engine_options_come_from_the_catalog() -> None:
    spec = chat_spec(
        options={
            "dtype": "bfloat16",
            "max_model_len": 512,
            "kv_cache_bytes": 64 * MB,
            "max_num_seqs": 8,
            "max_num_batched_tokens": 256,
        }
    )
    config = engine_config_for(spec)
    assert config.model.model == "x.gguf"
    assert config.model.dtype == "bfloat16"
    assert config.model.max_model_len == 512
    assert config.cache.kv_cache_bytes == 64 * MB
    assert config.scheduler.max_num_seqs == 8
    assert config.scheduler.max_num_batched_tokens == 256


def test_admission_limits_and_unknown_engine_options() -> None:
    spec = chat_spec(options={"max_waiting_requests": 4, "max_waiting_prompt_tokens": 900})
    assert engine_config_for(spec).admission == AdmissionConfig(
        max_waiting_requests=4, max_waiting_prompt_tokens=900
    )
    assert engine_config_for(chat_spec()).admission == AdmissionConfig()
    with pytest.raises(ValueError, match="max_num_seq"):
        engine_config_for(chat_spec(options={"max_num_seq": 8}))
    with pytest.raises(ValueError, match="poison_token_ids"):  # a test fixture now (fault_drill)
        engine_config_for(chat_spec(options={"poison_token_ids": [7]}))


def test_speculative_decoding_options_and_a_draft_named_by_catalog_id() -> None:
    assert engine_config_for(chat_spec()).speculative is None
    ngram = engine_config_for(chat_spec(options={"draft": "ngram", "prompt_lookup_max": 6}))
    assert (ngram.speculative.method, ngram.speculative.prompt_lookup_max) == ("ngram", 6)
    own = engine_config_for(chat_spec(options={"draft": "self", "draft_layers": 5}))
    assert (own.speculative.method, own.speculative.draft_layers) == ("self_draft", 5)
    small = ModelSpec(id="small", kind=ModelKind.CHAT, backend="llm", source="small-folder")
    big = chat_spec(
        options={
            "draft": "small",
            "num_speculative_tokens": 6,
            "speculative_long_output_tokens": 32,
            "speculative_disable_by_batch_size": 4,
        }
    )
    catalog = Catalog([small, big])
    config = engine_config_for(catalog.resolve(big.id)).speculative
    assert (config.method, config.draft_model) == ("draft", "small-folder")
    assert (config.num_speculative_tokens, config.long_output_tokens) == (6, 32)
    assert config.disable_by_batch_size == 4
    with pytest.raises(ValueError, match="not another LLM"):
        Catalog([chat_spec(options={"draft": "missing"})])


def test_lora_options_turn_adapters_on() -> None:
    from modelyard.manager.loaders import lora_modules_of

    assert engine_config_for(chat_spec()).lora is None
    spec = chat_spec(
        options={"lora_modules": {"finance": "/a/finance"}, "max_loras": 8, "max_lora_rank": 32}
    )
    lora = engine_config_for(spec).lora
    assert (lora.max_loras, lora.max_lora_rank, lora.max_cpu_loras) == (8, 32, 16)
    assert lora_modules_of(spec) == {"finance": "/a/finance"}
    with pytest.raises(ValueError, match="lora_modules"):
        lora_modules_of(chat_spec(options={"lora_modules": ["finance"]}))
