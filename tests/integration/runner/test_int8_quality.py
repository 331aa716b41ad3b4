"""Weight-only int8 (MODELYARD_WEIGHTS=int8) on the real default model, against the same model
with its float32 weights, in float32:
- perplexity on a text shipped with the tests (tests/data/perplexity.txt, ~560 tokens) rises by
  at most 5 %;
- the next-token argmax over every position of that text agrees in at least 90 % of them;
- free-running greedy decoding of a fixed prompt set (16 tokens each) keeps, on average, at
  least half of each continuation identical before the first different token.
Measured on this model (an AMX host): perplexity 37.36 -> 37.21, argmax agreement 94.1 %,
greedy prefixes kept 16, 6, 16, 16, 16, 5, 1 and 16 tokens (0.72 of them on average)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from modelyard.cache_dir import cache_dir_from_environment
from modelyard.engine.config import kernels_from_environment
from modelyard.runner import kernels
from modelyard.runner.attention import AttentionMetadata
from modelyard.runner.loader import DEFAULT_MODEL, resolve_model, weight_source
from modelyard.runner.models.decoder import DecoderModel

CACHE_DIR = cache_dir_from_environment()  # where the GGUF conversion is cached

KERNELS = kernels_from_environment()  # the switches of this test run's environment

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(900),  # two models' loads and 2 x 8 x 16 greedy forwards
    pytest.mark.skipif(not kernels.load(KERNELS), reason="the runner's kernels did not build here"),
]

TEXT = Path(__file__).resolve().parents[2] / "data" / "perplexity.txt"
PROMPTS = [
    "The capital of France is",
    "Here is a short poem about the sea:",
    "def fibonacci(n):",
    "The three primary colours are",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
    "To make a cup of tea, first",
    "The largest planet in the solar system is",
]
NEW_TOKENS = 16
BLOCK = 16


def load(weights: str) -> DecoderModel:
    resolved = resolve_model(DEFAULT_MODEL, CACHE_DIR)
    config = dataclasses.replace(KERNELS, weights=weights)  # type: ignore[arg-type]
    return DecoderModel(
        weight_source(resolved, use_blocks=False), resolved.architecture, resolved.config,
        dtype=torch.float32, num_blocks=64, block_size=BLOCK, max_model_len=1024,
        kernel_config=config,
    )  # fmt: skip


def all_logits(model: DecoderModel, ids: list[int]) -> torch.Tensor:
    """(T, V) logits of every position of one sequence, attended from position 0."""
    blocks = list(range((len(ids) + BLOCK - 1) // BLOCK))
    meta = AttentionMetadata.build([0], [len(ids)], [blocks], BLOCK, model.sliding_window)
    with torch.inference_mode():
        rows = torch.arange(len(ids))
        return model.forward(torch.tensor(ids), meta, rows).float()


def greedy(model: DecoderModel, ids: list[int]) -> list[int]:
    out: list[int] = []
    for _ in range(NEW_TOKENS):
        out.append(int(all_logits(model, [*ids, *out])[-1].argmax()))
    return out


@pytest.fixture(scope="module")
def models() -> dict[str, DecoderModel]:
    return {name: load(name) for name in ("", "int8")}


def test_int8_weights_are_in_use(models: dict[str, DecoderModel]) -> None:
    assert models["int8"].layers[0].qkv._int8 is not None
    assert models[""].layers[0].qkv._int8 is None
    assert models[""].kernel_config.weights == ""  # each model has its own switches


def test_int8_perplexity_and_argmax_agreement(models: dict[str, DecoderModel]) -> None:
    tok = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL, CACHE_DIR).tokenizer_path)
    ids = tok.encode(TEXT.read_text())
    results = {}
    for name, model in models.items():
        logits = all_logits(model, ids)[:-1]
        nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]))
        results[name] = (math.exp(float(nll)), logits.argmax(-1))
    (ppl, top), (ppl8, top8) = results[""], results["int8"]
    agreement = float((top == top8).float().mean())
    print(f"perplexity {ppl:.2f} -> {ppl8:.2f}, argmax agreement {agreement:.3f}")
    assert ppl8 <= ppl * 1.05
    assert agreement >= 0.90


def test_int8_greedy_continuations_agree(models: dict[str, DecoderModel]) -> None:
    tok = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL, CACHE_DIR).tokenizer_path)
    prefixes = []
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        ours, ref = greedy(models["int8"], ids), greedy(models[""], ids)
        same = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=True)) if a != b), None)
        prefixes.append(NEW_TOKENS if same is None else same)
    mean = sum(prefixes) / len(prefixes) / NEW_TOKENS
    print(f"greedy prefix kept: {prefixes} -> {mean:.2f}")
    assert mean >= 0.5
