"""Speculative sampling keeps plain sampling's distribution under every sampling filter, for the
three proposers (a tiny random Llama through the whole engine, in this process).

For each filter set (top_k, top_p and min_p alone, the three together, penalties with
min_tokens) and each proposer (n-gram, draft model, self-draft), 300 requests sample 3 tokens
with speculation forced on. The second token comes from verifying one draft (accepted, or drawn
from the residual), the third is the bonus after an accepted draft or a plain step. Their
counts must fit the exact distributions of plain sampling, computed from transformers' logits
with the sampler's rules written out here (chi-square, p = 0.001).

So that every proposer's drafts are sometimes accepted: the draft model is the target itself
(its drafts are the target's argmax), and the prompt starts with pairs [likely first token, its
likeliest successor], which prompt lookup finds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from acceptance_helpers import BLOCK_SIZE, TINY_VOCAB_EOS, random_corpus, run_core, tiny_model

from modelyard.engine.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    kernels_from_environment,
)
from modelyard.engine.core.engine_core import EngineCore
from modelyard.engine.sampling_params import SamplingParams
from modelyard.runner.model_runner import ModelRunner
from modelyard.runner.spec_decode.ngram import lookup

KERNELS = kernels_from_environment()  # the switches of this test run's environment

pytestmark = pytest.mark.integration

NUM_REQUESTS = 300
FILTERS: dict[str, dict[str, Any]] = {
    "top_k": {"top_k": 4},
    "top_p": {"temperature": 0.8, "top_p": 0.5},
    "min_p": {"min_p": 0.45},
    "combined": {"temperature": 0.9, "top_k": 8, "top_p": 0.8, "min_p": 0.4},
    "penalties": {
        "temperature": 0.8,
        "top_k": 6,
        "repetition_penalty": 1.4,
        "frequency_penalty": 0.6,
        "presence_penalty": 0.4,
        "min_tokens": 2,  # the prompt's likeliest next token is banned for two tokens
    },
}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Path:
    return tiny_model("llama", tmp_path_factory.mktemp("spec-filters"), tiny_llama_dir)


@pytest.fixture(scope="module")
def hf(target: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()


def next_logits(hf: Any, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
    """transformers' next-token logits (N, V) after each of N sequences of one length."""
    with torch.inference_mode():
        return hf(torch.tensor([list(s) for s in sequences]), logits_to_keep=1).logits[:, -1]


@pytest.fixture(scope="module")
def prompt(hf: Any) -> list[int]:
    """Pairs [t, its likeliest successor] for the 100 likeliest first tokens t, then a stretch
    of the corpus. The pairs change the first token's distribution, so the pairs are made again
    for the new prompt a few times; the prompt whose n-gram drafts are accepted most wins."""
    tail = random_corpus(hf.config.vocab_size)[:10]
    candidates = [tail]
    for _ in range(4):
        firsts = next_logits(hf, [candidates[-1]])[0].topk(100).indices.tolist()
        successors = next_logits(hf, [[*candidates[-1], t] for t in firsts]).argmax(-1).tolist()
        candidates.append([t for pair in zip(firsts, successors, strict=True) for t in pair] + tail)
    return max(candidates, key=lambda p: ngram_acceptance(hf, p, SamplingParams(min_p=0.3)))


def ngram_acceptance(hf: Any, prompt: list[int], params: SamplingParams) -> float:
    """The probability that the second token is an accepted one-token n-gram draft."""
    first = reference(next_logits(hf, [prompt])[0], params, prompt, [])
    tokens = first.nonzero().flatten().tolist()
    rows = next_logits(hf, [[*prompt, t] for t in tokens])
    accepted = 0.0
    for t, row in zip(tokens, rows, strict=True):
        proposal = lookup(np.array([*prompt, t], dtype=np.int64), 1, 4, 1)
        if proposal:
            accepted += float(first[t] * reference(row, params, prompt, [t])[proposal[0]])
    return accepted


def reference(
    logits: torch.Tensor, params: SamplingParams, prompt: Sequence[int], output: Sequence[int]
) -> torch.Tensor:
    """The distribution plain sampling draws from after prompt + output: (V,) float64."""
    logits = logits.double().clone()
    if len(output) < params.min_tokens:
        logits[[TINY_VOCAB_EOS, *params.stop_token_ids]] = float("-inf")
    for token in {*prompt, *output}:
        value = logits[token]
        r = params.repetition_penalty
        logits[token] = value / r if value > 0 else value * r
    for token, count in Counter(output).items():
        logits[token] -= count * params.frequency_penalty + params.presence_penalty
    probs = torch.softmax(logits / params.temperature, 0)
    if params.top_k > 0:
        probs[probs < probs.topk(params.top_k).values[-1]] = 0.0
        probs /= probs.sum()
    if params.top_p < 1.0:  # the nucleus: drop tokens with top_p before them
        ordered, order = probs.sort(descending=True)
        probs[order[ordered.cumsum(0) - ordered >= params.top_p]] = 0.0
    probs[probs < params.min_p * probs.max()] = 0.0
    return probs / probs.sum()


def marginals(
    hf: Any, prompt: list[int], params: SamplingParams, depth: int = 3
) -> list[torch.Tensor]:
    """The exact distribution of each of the first `depth` output tokens (V,) under plain
    sampling, by expanding every prefix of positive probability."""
    layer: dict[tuple[int, ...], float] = {(): 1.0}
    out = []
    for _ in range(depth):
        prefixes = list(layer)
        rows = next_logits(hf, [[*prompt, *p] for p in prefixes])
        marginal = torch.zeros(rows.shape[1], dtype=torch.float64)
        following: dict[tuple[int, ...], float] = {}
        for prefix, row in zip(prefixes, rows, strict=True):
            probs = reference(row, params, prompt, prefix)
            marginal += layer[prefix] * probs
            for token in probs.nonzero().flatten().tolist():
                following[(*prefix, token)] = layer[prefix] * float(probs[token])
        out.append(marginal)
        layer = following
    return out


@dataclass
class Speculating:
    """A runner with a proposer, and the speculative config its cores schedule with."""

    runner: ModelRunner
    config: SpeculativeConfig


@pytest.fixture(scope="module", params=["ngram", "draft", "self_draft"])
def spec(request: pytest.FixtureRequest, target: Path) -> Speculating:
    config = SpeculativeConfig(
        method=request.param,
        num_speculative_tokens=2,
        draft_model=str(target) if request.param == "draft" else None,
        draft_layers=1,
        prompt_lookup_min=1,
        disable_by_batch_size=64,
    )
    runner = ModelRunner(
        ModelConfig(model=str(target), num_threads=1),
        CacheConfig(block_size=BLOCK_SIZE, num_blocks=256),
        config,
        kernels=KERNELS,
    )
    return Speculating(runner, config)


def sampling(name: str, hf: Any, prompt: list[int]) -> SamplingParams:
    values = {"max_tokens": 3, "speculate": True, "ignore_eos": True, **FILTERS[name]}
    if "min_tokens" in values:
        values["stop_token_ids"] = [int(next_logits(hf, [prompt])[0].argmax())]
    return SamplingParams(**values).validate()


def chi_square_limit(df: int, z: float = 3.09) -> float:
    """The chi-square quantile at p = 0.001 (Wilson-Hilferty; exact for one degree)."""
    if df <= 1:
        return 10.83
    return float(df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3)


def assert_fits(tokens: list[int], expected: torch.Tensor, what: str) -> None:
    """Counts of `tokens` fit n x expected: none where it is 0, chi-square over the bins of
    at least 5 expected draws plus one bin for the rest."""
    n = len(tokens)
    counts = torch.bincount(torch.tensor(tokens), minlength=expected.numel()).double()
    assert int(counts[expected == 0].sum()) == 0, f"{what}: a token outside the filters"
    big = expected * n >= 5
    observed = torch.cat([counts[big], counts[~big].sum().unsqueeze(0)])
    wanted = torch.cat([expected[big] * n, (expected[~big].sum() * n).unsqueeze(0)])
    keep = wanted > 0
    chi2 = float(((observed[keep] - wanted[keep]) ** 2 / wanted[keep]).sum())
    assert chi2 < chi_square_limit(int(keep.sum()) - 1), (what, chi2, observed, wanted)


@pytest.mark.parametrize("name", FILTERS)
def test_speculative_sampling_keeps_the_distribution(
    spec: Speculating, hf: Any, prompt: list[int], name: str
) -> None:
    params = sampling(name, hf, prompt)
    core = EngineCore(
        EngineConfig(
            model=ModelConfig(model="preloaded"),
            cache=CacheConfig(block_size=BLOCK_SIZE),
            scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048),
            speculative=spec.config,
        ),
        spec.runner,
    )
    torch.manual_seed(0)
    run = run_core(core, {f"s{i}": prompt for i in range(NUM_REQUESTS)}, params)
    assert run.stats is not None
    drafts = run.stats.spec_decode_num_drafts  # second tokens that verified a draft
    assert drafts >= NUM_REQUESTS // 10
    assert run.stats.spec_decode_num_accepted_tokens > 0
    expected = marginals(hf, prompt, params)
    for position in (1, 2):
        tokens = [out[position] for out in run.tokens.values()]
        assert_fits(tokens, expected[position], f"{spec.config.method}/{name}/{position}")
