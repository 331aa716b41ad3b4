"""Structured output through the whole engine on a tiny random Llama (in this process): a
batch mixing constrained (regex, choice, JSON schema; greedy and sampled) and unconstrained
requests, with a KV cache so small that requests are preempted and recomputed mid-output.
Every constrained output matches its constraint and ends with EOS; the unconstrained greedy
request gets the same tokens as when it runs alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from acceptance_helpers import (
    BLOCK_SIZE,
    BlockLimit,
    load_runner,
    make_core,
    random_corpus,
    run_core,
    tiny_model,
)

from modelyard.engine import constraints
from modelyard.engine.messages import FinishReason
from modelyard.engine.sampling_params import SamplingParams
from modelyard.runner.model_runner import ModelRunner

pytestmark = pytest.mark.integration

REGEX = r"[a-z]{20,24}"
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Tokyo"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["city", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> ModelRunner:
    return load_runner(tiny_model("llama", tmp_path_factory.mktemp("structured"), tiny_llama_dir))


def test_constrained_and_free_requests_with_preemption(runner: ModelRunner) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(runner.tokenizer_path)
    corpus = random_corpus(runner.vocab_size)
    lengths = {"free": 14, "re0": 13, "re1": 12, "choice": 11, "json0": 10, "json1": 9}
    prompts = {rid: corpus[7 * i : 7 * i + n] for i, (rid, n) in enumerate(lengths.items())}
    free = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    params = {
        "free": free,
        "re0": SamplingParams(temperature=0.0, max_tokens=60, constraint=constraints.regex(REGEX)),
        "re1": SamplingParams(
            temperature=1.0, seed=1, max_tokens=60, constraint=constraints.regex(REGEX)
        ),
        "choice": SamplingParams(
            temperature=1.0,
            seed=2,
            max_tokens=20,
            constraint=constraints.choice(["Paris", "Tokyo"]),
        ),
        "json0": SamplingParams(
            temperature=0.0, max_tokens=60, constraint=constraints.json_schema(SCHEMA)
        ),
        "json1": SamplingParams(
            temperature=1.0, seed=3, max_tokens=60, constraint=constraints.json_schema(SCHEMA)
        ),
    }
    alone = run_core(make_core(runner), {"free": prompts["free"]}, free)
    num_blocks = sum(-(-len(p) // BLOCK_SIZE) for p in prompts.values())  # every one must grow
    run = run_core(make_core(BlockLimit(runner, num_blocks)), prompts, params)
    assert run.stats is not None
    assert run.stats.num_preemptions > 0
    assert run.tokens["free"] == alone.tokens["free"]
    eos = set(runner.eos_token_ids)
    for rid in ("re0", "re1", "choice", "json0", "json1"):
        assert run.finish[rid] == FinishReason.STOP, rid
        assert run.tokens[rid][-1] in eos
        text = tokenizer.decode(run.tokens[rid][:-1])
        if rid.startswith("re"):
            assert re.fullmatch(REGEX, text), text
        elif rid == "choice":
            assert text in {"Paris", "Tokyo"}
        else:
            jsonschema.validate(json.loads(text), SCHEMA)
    assert run.stats.structured_requests == 5
    assert run.stats.structured_mask_steps > 0
