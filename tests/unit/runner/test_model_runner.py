"""ModelRunner greedy tokens equal transformers generate(do_sample=False), token for token,
for the native path (Llama, tied Llama, Qwen2 with biases) and the generic path (GPT-2, OPT),
over mixed batches, chunked prefill, shared prefix blocks and restarts at position 0."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from runner_driver import VOCAB, Driver, assert_matches_reference, hf_greedy, make_runner

from modelyard.engine.config import CacheConfig, ModelConfig, kernels_from_environment
from modelyard.runner.model_runner import ModelRunner

KERNELS = kernels_from_environment()  # the switches of this test run's environment

pytestmark = pytest.mark.unit

NATIVE = ["llama", "llama_tied", "qwen2"]
GENERIC = ["gpt2", "opt"]


def _prompts(n: int, seed: int, low: int = 3, high: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(rng.randint(low, high))] for _ in range(n)]


@pytest.fixture(scope="module")
def runners(tiny_models: dict[str, Path]) -> dict[str, ModelRunner]:
    return {name: make_runner(folder) for name, folder in tiny_models.items()}


@pytest.mark.parametrize("name", NATIVE + GENERIC)
def test_implementation_is_chosen_from_the_architecture(
    runners: dict[str, ModelRunner], name: str
) -> None:
    assert runners[name].implementation == ("native" if name in NATIVE else "generic")


def test_native_refused_for_unsupported_architecture(tiny_models: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="no native implementation"):
        make_runner(tiny_models["gpt2"], implementation="native")


def test_generic_can_be_forced_for_llama(tiny_models: dict[str, Path]) -> None:
    runner = make_runner(tiny_models["llama"], implementation="generic")
    assert runner.implementation == "generic"
    prompt = _prompts(1, seed=5)[0]
    driver = Driver(runner)
    driver.add("a", prompt, 6)
    assert_matches_reference(driver.run()["a"], hf_greedy(tiny_models["llama"], prompt, 6))


@pytest.mark.parametrize("name", NATIVE + GENERIC)
@pytest.mark.parametrize("batch", [1, 8])
def test_greedy_batch_matches_generate(
    runners: dict[str, ModelRunner], tiny_models: dict[str, Path], name: str, batch: int
) -> None:
    prompts = _prompts(batch, seed=batch)
    driver = Driver(runners[name])
    for i, p in enumerate(prompts):
        driver.add(f"r{i}", p, 8)
    outputs = driver.run()
    for i, p in enumerate(prompts):
        assert_matches_reference(outputs[f"r{i}"], hf_greedy(tiny_models[name], p, 8))


@pytest.mark.parametrize("name", ["llama", "qwen2", "opt"])
def test_chunked_prefill_matches_generate(
    runners: dict[str, ModelRunner], tiny_models: dict[str, Path], name: str
) -> None:
    prompts = _prompts(3, seed=11, low=30, high=60)
    driver = Driver(runners[name], chunk=7)  # 7 does not divide the block size: chunks straddle
    for i, p in enumerate(prompts):
        driver.add(f"c{i}", p, 6)
    outputs = driver.run()
    for i, p in enumerate(prompts):
        assert_matches_reference(outputs[f"c{i}"], hf_greedy(tiny_models[name], p, 6))


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_shared_prefix_blocks(
    runners: dict[str, ModelRunner], tiny_models: dict[str, Path], name: str
) -> None:
    prefix = _prompts(1, seed=21, low=13, high=13)[0]  # 3 full blocks of 4 + 1
    a_prompt = [*prefix, 10, 11, 12]
    b_prompt = [*prefix, 20, 21]
    driver = Driver(runners[name])
    driver.add("a", a_prompt, 5)
    driver.step()  # a's prefill fills blocks 0..3
    b = driver.add("b", b_prompt, 5, shared_from="a", shared_blocks=3)
    assert b.num_computed == 12  # b starts at start_position = shared length
    outputs = driver.run()
    assert driver.requests["b"].block_table[:3] == driver.requests["a"].block_table[:3]
    assert_matches_reference(outputs["a"], hf_greedy(tiny_models[name], a_prompt, 5))
    assert_matches_reference(outputs["b"], hf_greedy(tiny_models[name], b_prompt, 5))


@pytest.mark.parametrize("name", ["llama", "opt"])
def test_restart_at_position_zero(
    runners: dict[str, ModelRunner], tiny_models: dict[str, Path], name: str
) -> None:
    prompts = _prompts(2, seed=31)
    driver = Driver(runners[name], chunk=9)
    driver.add("x", prompts[0], 8)
    driver.add("y", prompts[1], 8)
    for _ in range(8):
        driver.step()
    driver.preempt("x")  # recompute prompt + output so far into fresh blocks
    outputs = driver.run()
    assert_matches_reference(outputs["x"], hf_greedy(tiny_models[name], prompts[0], 8))
    assert_matches_reference(outputs["y"], hf_greedy(tiny_models[name], prompts[1], 8))


def test_bfloat16_native_runs_close_to_float32(tiny_models: dict[str, Path]) -> None:
    runner = make_runner(tiny_models["llama"], dtype="bfloat16")
    assert runner.dtype == torch.bfloat16
    prompts = _prompts(4, seed=41)
    driver = Driver(runner)
    for i, p in enumerate(prompts):
        driver.add(f"b{i}", p, 4)
    outputs = driver.run()
    first_tokens_equal = sum(
        outputs[f"b{i}"][0] == hf_greedy(tiny_models["llama"], p, 1)[0]
        for i, p in enumerate(prompts)
    )
    assert first_tokens_equal >= 3  # bf16 rounding may flip a near-tie, not most tokens


def test_kv_blocks_from_byte_budget(tiny_models: dict[str, Path]) -> None:
    # llama: 2 layers x (K+V) x block 4 x 2 kv heads x head dim 16 x 4 bytes = 2048 B / block
    runner = ModelRunner(
        ModelConfig(model=str(tiny_models["llama"])),
        CacheConfig(block_size=4, kv_cache_bytes=100 * 1024),
        kernels=KERNELS,
    )
    assert runner.num_kv_blocks == 50
    assert runner.max_model_len == 256
    assert runner.eos_token_ids == [2]
    assert Path(runner.model_path) == tiny_models["llama"]
