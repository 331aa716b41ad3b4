"""LoRA adapters on the default model, SmolLM2-135M-Instruct (float32), through the whole engine
in this process: adapters made here with `peft` (non-zero B) give, greedy, exactly the tokens of
peft's merged model (checked teacher-forced: its argmax at every generated position), and a
batch mixing them with the plain base gives each request its tokens alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from acceptance_helpers import BLOCK_SIZE

from lora_helpers import MergedReference, lora_request, make_adapter
from modelyard.engine.config import CacheConfig, EngineConfig, LoRAConfig, ModelConfig
from modelyard.engine.core import EngineCore
from modelyard.engine.messages import EngineRequest, LoRARequest
from modelyard.engine.sampling_params import SamplingParams
from modelyard.runner.loader import DEFAULT_MODEL, resolve_model
from modelyard.runner.model_runner import ModelRunner

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_TOKENS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
QUESTIONS = ["What is the capital of France?", "Name three colours of the rainbow."]


@pytest.fixture(scope="module")
def base() -> Path:
    return resolve_model(DEFAULT_MODEL).path


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory, base: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("smollm2-adapters")
    return {
        "all-r8": make_adapter(base, root / "a", seed=1, rank=8, std=0.08),
        "attn-r16": make_adapter(
            base,
            root / "b",
            seed=2,
            rank=16,
            std=0.08,
            target_modules=["q_proj", "v_proj", "o_proj"],
        ),
    }


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(
        ModelConfig(model=DEFAULT_MODEL, num_threads=1, max_model_len=512),
        CacheConfig(block_size=BLOCK_SIZE, num_blocks=64),
        lora=LoRAConfig(max_loras=2, max_lora_rank=16),
    )


def prompt_ids(runner: ModelRunner, question: str) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(runner.tokenizer_path)
    messages = [{"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def run(
    runner: ModelRunner, requests: dict[str, tuple[list[int], LoRARequest | None]]
) -> dict[str, list[int]]:
    config = EngineConfig(
        model=ModelConfig(model="preloaded"),
        cache=CacheConfig(block_size=BLOCK_SIZE),
        lora=LoRAConfig(max_loras=2, max_lora_rank=16),
    )
    core = EngineCore(config, runner)
    for rid, (ids, lora) in requests.items():
        core.add_request(
            EngineRequest(request_id=rid, prompt_token_ids=ids, sampling_params=GREEDY, lora=lora)
        )
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}
    while core.has_unfinished_requests():
        for out in core.step():
            assert out.error is None, out.error
            tokens[out.request_id] += out.new_token_ids
    return tokens


def test_adapters_equal_peft_merged_and_mix_with_the_base(
    runner: ModelRunner, base: Path, adapters: dict[str, Path]
) -> None:
    ref = MergedReference(base)
    loras = {name: lora_request(name, path, i) for i, (name, path) in enumerate(adapters.items())}
    prompts = [prompt_ids(runner, q) for q in QUESTIONS]
    requests: dict[str, tuple[list[int], LoRARequest | None]] = {}
    for i, ids in enumerate(prompts):
        requests[f"base-{i}"] = (ids, None)
        for name in adapters:
            requests[f"{name}-{i}"] = (ids, loras[name])
    together = run(runner, requests)
    for rid, (ids, lora) in requests.items():
        path = adapters[lora.name] if lora is not None else None
        assert together[rid] == ref.forced_argmax(path, ids, together[rid]), rid
    for i in range(len(prompts)):
        outputs = {tuple(together[f"{name}-{i}"]) for name in ("base", *adapters)}
        assert len(outputs) == 3  # each adapter changes the answer
    alone = run(runner, {"all-r8-1": requests["all-r8-1"]})
    assert alone["all-r8-1"] == together["all-r8-1"]
