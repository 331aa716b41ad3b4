"""The real default model (SmolLM2-135M-Instruct Q4_1 GGUF): its config and tokenizer folder is
cached (no weights in it), and greedy chat through ModelRunner equals transformers generate on
the file's weights dequantized (GGUFSource)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from modelyard.engine.config import CacheConfig, ModelConfig, kernels_from_environment
from modelyard.engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from modelyard.engine.sampling_params import SamplingParams
from modelyard.runner import loader
from modelyard.runner.loader import DEFAULT_MODEL, resolve_model, weight_source
from modelyard.runner.model_runner import ModelRunner
from modelyard.runner.models.hf_generic import model_from_source

KERNELS = kernels_from_environment()  # the switches of this test run's environment

pytestmark = pytest.mark.integration

QUESTION = "What is the capital of France?"
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # <cache_dir>/gguf, as resolve_model lays it out (ModelConfig.cache_dir)
    return tmp_path_factory.mktemp("cache") / "gguf"


@pytest.fixture(scope="module")
def converted(cache_dir: Path) -> Path:
    return resolve_model(DEFAULT_MODEL, str(cache_dir.parent)).path


def test_conversion_is_cached(
    converted: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (converted / "config.json").is_file()
    assert not list(converted.glob("*.safetensors"))  # the weights stay in the GGUF file
    assert (converted / "tokenizer.json").is_file()
    assert "quantization_config" not in (converted / "config.json").read_text()

    def no_reconvert(*_: object) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(loader, "_write_folder", no_reconvert)
    t0 = time.perf_counter()
    again = resolve_model(DEFAULT_MODEL, str(cache_dir.parent))
    assert time.perf_counter() - t0 < 3.0
    assert again.path == converted
    assert again.architecture == "LlamaForCausalLM"
    assert [p.name for p in cache_dir.iterdir()] == [converted.name]  # no leftover temp dirs


def _chat_ids(folder: Path) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    return [int(t) for t in ids]


def _greedy(runner: ModelRunner, prompt: list[int]) -> list[int]:
    params = SamplingParams(temperature=0.0)
    out: list[int] = []
    table = list(range((len(prompt) + MAX_TOKENS) // runner.block_size + 1))
    tokens, start = list(prompt), 0
    while len(out) < MAX_TOKENS:
        req = ScheduledRequest("q", tokens, start, table, True, params, prompt, out)
        token = runner.execute(SchedulerOutput([req], len(tokens))).sampled_token_ids["q"]
        out.append(token)
        if token in runner.eos_token_ids:
            break
        start, tokens = start + len(tokens), [token]
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_chat_matches_generate(converted: Path, cache_dir: Path, dtype: str) -> None:
    from transformers import AutoTokenizer

    runner = ModelRunner(
        ModelConfig(model=DEFAULT_MODEL, dtype=dtype, cache_dir=str(cache_dir.parent)),  # type: ignore[arg-type]
        CacheConfig(num_blocks=64),
        kernels=KERNELS,
    )
    assert runner.implementation == "native"
    assert Path(runner.model_path) == converted
    prompt = _chat_ids(Path(runner.tokenizer_path))
    ours = _greedy(runner, prompt)

    resolved = resolve_model(DEFAULT_MODEL, str(cache_dir.parent))
    source = weight_source(resolved, use_blocks=False)
    model = model_from_source(converted, source, getattr(torch, dtype))
    ids = torch.tensor([prompt])
    ref = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, do_sample=False
    )[0, len(prompt) :].tolist()
    assert ours == ref
    text = AutoTokenizer.from_pretrained(converted).decode(ours, skip_special_tokens=True)
    assert "Paris" in text
