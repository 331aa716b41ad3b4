"""LoRA adapters through the whole engine on a tiny random Llama (in this process), adapters
made with `peft` (non-zero B, several ranks and target sets, alpha_pattern, rsLoRA): greedy
tokens equal peft's merged model; a batch mixing four adapters and the base gives each request
its tokens alone; more adapters than slots wait their turn; the prefix cache never shares KV
between adapters; adapters that do not fit, or are malformed in any way, fail their request
alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from acceptance_helpers import BLOCK_SIZE, random_corpus, tiny_model

from lora_helpers import (
    MALFORMED,
    MergedReference,
    lora_request,
    make_adapter,
    malformed_adapters,
    tiny_llama,
)
from modelyard.engine.config import (
    CacheConfig,
    EngineConfig,
    LoRAConfig,
    ModelConfig,
    kernels_from_environment,
)
from modelyard.engine.core.engine_core import EngineCore
from modelyard.engine.messages import EngineRequest, LoRARequest
from modelyard.engine.sampling_params import SamplingParams
from modelyard.runner.model_runner import ModelRunner

KERNELS = kernels_from_environment()  # the switches of this test run's environment

pytestmark = pytest.mark.integration

MAX_TOKENS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Path:
    return tiny_model("llama", tmp_path_factory.mktemp("lora"), tiny_llama_dir)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory, base: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "all-r8": make_adapter(base, root / "a", seed=1, rank=8),
        "attn-r4": make_adapter(
            base, root / "b", seed=2, rank=4, target_modules=["q_proj", "v_proj"]
        ),
        "mlp-r16": make_adapter(
            base, root / "c", seed=3, rank=16, target_modules=["gate_proj", "up_proj", "down_proj"]
        ),
        "rslora-r2": make_adapter(
            base, root / "d", seed=4, rank=2, use_rslora=True, alpha_pattern={"o_proj": 7}
        ),
    }


@pytest.fixture(scope="module")
def runner(base: Path) -> ModelRunner:
    return ModelRunner(
        ModelConfig(model=str(base), num_threads=1),
        CacheConfig(block_size=BLOCK_SIZE, num_blocks=128),
        lora=LoRAConfig(max_loras=4, max_lora_rank=16),
        kernels=KERNELS,
    )


@pytest.fixture(scope="module")
def ref(base: Path) -> MergedReference:
    return MergedReference(base)


@pytest.fixture(scope="module")
def corpus(base: Path) -> list[int]:
    from transformers import AutoConfig

    return random_corpus(AutoConfig.from_pretrained(base).vocab_size)


def core(runner: ModelRunner, max_loras: int = 4) -> EngineCore:
    config = EngineConfig(
        model=ModelConfig(model="preloaded"),
        cache=CacheConfig(block_size=BLOCK_SIZE),
        lora=LoRAConfig(max_loras=max_loras, max_lora_rank=16),
    )
    return EngineCore(config, runner)


def requests(
    prompts: dict[str, list[int]], loras: dict[str, LoRARequest | None]
) -> list[EngineRequest]:
    return [
        EngineRequest(request_id=rid, prompt_token_ids=ids, sampling_params=GREEDY, lora=loras[rid])
        for rid, ids in prompts.items()
    ]


def run(engine: EngineCore, reqs: list[EngineRequest]) -> dict[str, list[int]]:
    for request in reqs:
        engine.add_request(request)
    tokens: dict[str, list[int]] = {r.request_id: [] for r in reqs}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.error is None, out.error
            tokens[out.request_id] += out.new_token_ids
    return tokens


def loras_of(adapters: dict[str, Path]) -> dict[str, LoRARequest]:
    return {name: lora_request(name, path, i) for i, (name, path) in enumerate(adapters.items())}


def test_each_adapter_equals_peft_merged_model(
    runner: ModelRunner, adapters: dict[str, Path], ref: MergedReference, corpus: list[int]
) -> None:
    loras = loras_of(adapters)
    prompt = corpus[:23]
    for name, path in adapters.items():
        tokens = run(core(runner), requests({name: prompt}, {name: loras[name]}))[name]
        assert tokens == ref.greedy(path, prompt, MAX_TOKENS), name
    base_tokens = run(core(runner), requests({"base": prompt}, {"base": None}))["base"]
    assert base_tokens == ref.greedy(None, prompt, MAX_TOKENS)
    outputs = {tuple(ref.greedy(p, prompt, MAX_TOKENS)) for p in [None, *adapters.values()]}
    assert len(outputs) == 5  # every adapter changes the output


def test_mixed_batch_of_four_adapters_and_the_base_equals_each_alone(
    runner: ModelRunner, adapters: dict[str, Path], corpus: list[int]
) -> None:
    loras: dict[str, LoRARequest | None] = {**loras_of(adapters), "base": None}
    prompts = {name: corpus[10 * i : 10 * i + 17 + 3 * i] for i, name in enumerate(loras)}
    alone = {
        name: run(core(runner), requests({name: prompts[name]}, loras))[name] for name in loras
    }
    together = run(core(runner), requests(prompts, loras))
    assert together == alone
    stats = core(runner).stats()
    assert set(stats.lora_resident) == set(adapters)
    assert stats.lora_resident_bytes > 0


def test_more_adapters_than_slots_wait_and_evict(
    runner: ModelRunner, adapters: dict[str, Path], corpus: list[int]
) -> None:
    loras: dict[str, LoRARequest | None] = dict(loras_of(adapters))
    prompts = {name: corpus[50 + 7 * i : 70 + 7 * i] for i, name in enumerate(loras)}
    alone = {
        name: run(core(runner), requests({name: prompts[name]}, loras))[name] for name in loras
    }
    engine = core(runner, max_loras=2)
    for request in requests(prompts, loras):
        engine.add_request(request)
    tokens: dict[str, list[int]] = {name: [] for name in loras}
    most_running = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
        most_running = max(most_running, engine.stats().num_running)
    assert most_running == 2  # two adapters at a time: the others waited
    assert tokens == alone


def test_prefix_cache_is_never_shared_between_adapters(
    runner: ModelRunner, adapters: dict[str, Path], corpus: list[int]
) -> None:
    loras = loras_of(adapters)
    prompt = corpus[100:160]  # several full blocks
    engine = core(runner)
    order = [
        ("a1", "all-r8"),
        ("b1", "attn-r4"),
        ("base1", None),
        ("a2", "all-r8"),
        ("b2", "attn-r4"),
    ]
    cached = {}
    for rid, name in order:
        lora = loras[name] if name else None
        engine.add_request(
            EngineRequest(
                request_id=rid, prompt_token_ids=prompt, sampling_params=GREEDY, lora=lora
            )
        )
        while engine.has_unfinished_requests():
            for out in engine.step():
                cached.setdefault(out.request_id, out.num_cached_tokens)
    full_blocks = (len(prompt) - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert cached == {"a1": 0, "b1": 0, "base1": 0, "a2": full_blocks, "b2": full_blocks}


def test_an_adapter_that_does_not_fit_fails_its_request(
    runner: ModelRunner, base: Path, tmp_path: Path, corpus: list[int]
) -> None:
    too_big = make_adapter(base, tmp_path / "big", seed=5, rank=32)
    engine = core(runner)
    with pytest.raises(ValueError, match="max_lora_rank"):
        engine.add_request(
            EngineRequest(
                request_id="x",
                prompt_token_ids=corpus[:5],
                sampling_params=GREEDY,
                lora=lora_request("big", too_big, 99),
            )
        )
    with pytest.raises(ValueError, match="adapter_config"):
        runner.check_lora(lora_request("missing", tmp_path / "nothing", 100))
    assert not engine.has_unfinished_requests()


def test_a_malformed_adapter_fails_only_its_request(
    runner: ModelRunner, base: Path, adapters: dict[str, Path], tmp_path: Path, corpus: list[int]
) -> None:
    """Each malformed adapter is refused with its request, nothing of it kept; the same engine
    then serves a good adapter."""
    other_base = tiny_llama(tmp_path / "other-base", hidden=48)
    cases = malformed_adapters(base, adapters["attn-r4"], tmp_path, other_base=other_base)
    engine = core(runner)
    for i, case in enumerate(MALFORMED, start=200):
        folder, words = cases[case]
        lora = lora_request(case, folder, i)
        request = EngineRequest(
            request_id=case, prompt_token_ids=corpus[:5], sampling_params=GREEDY, lora=lora
        )
        with pytest.raises(ValueError, match=re.escape(words)):
            engine.add_request(request)
    assert not engine.has_unfinished_requests()
    good = lora_request("attn-r4", adapters["attn-r4"], 1)
    tokens = run(engine, requests({"good": corpus[:5]}, {"good": good}))["good"]
    assert len(tokens) == MAX_TOKENS
