"""Speculative decoding through the whole engine on a tiny random Llama (in this process):
greedy tokens equal plain decoding (and transformers) for the three proposers, in batches that
mix speculating and plain requests; preemption and abort mid-speculation; a stop string inside
an accepted run; sampled outputs keep the target's distribution (chi-square).

The draft model is a second tiny Llama with the target's tokenizer: one layer, initialised from
the target's embeddings and first layer so that its guesses are sometimes right.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
import torch
from acceptance_helpers import (
    BLOCK_SIZE,
    BlockLimit,
    EngineRun,
    HFReference,
    random_corpus,
    run_core,
    tiny_model,
)

from modelyard.engine import constraints
from modelyard.engine.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    kernels_from_environment,
)
from modelyard.engine.core.engine_core import EngineCore
from modelyard.engine.core.scheduler_output import StepRunner
from modelyard.engine.llm import LLM
from modelyard.engine.messages import EngineRequest
from modelyard.engine.sampling_params import SamplingParams
from modelyard.runner.model_runner import ModelRunner

KERNELS = kernels_from_environment()  # the switches of this test run's environment

pytestmark = pytest.mark.integration

MAX_TOKENS = 40
METHODS = ("ngram", "draft", "self_draft")


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Path:
    return tiny_model("llama", tmp_path_factory.mktemp("spec"), tiny_llama_dir)


@pytest.fixture(scope="module")
def draft(tmp_path_factory: pytest.TempPathFactory, target: Path) -> Path:
    """One layer of the target (embeddings, layer 0, final norm) as a model of its own."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target)
    model.model.layers = model.model.layers[:1]
    model.config.num_hidden_layers = 1
    folder = tmp_path_factory.mktemp("spec-draft")
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(target).save_pretrained(folder)
    return folder


def spec_config(method: str, draft: Path, **overrides: object) -> SpeculativeConfig:
    values: dict[str, object] = {
        "method": method,
        "num_speculative_tokens": 4,
        "draft_model": str(draft) if method == "draft" else None,
        "draft_layers": 1,
        "prompt_lookup_min": 1,
        "disable_by_batch_size": 64,
    }
    values.update(overrides)
    return SpeculativeConfig(**values)  # type: ignore[arg-type]


@dataclass
class Speculating:
    """A runner with a proposer, and the speculative config its cores schedule with."""

    runner: ModelRunner
    config: SpeculativeConfig


@pytest.fixture(scope="module", params=METHODS)
def spec(request: pytest.FixtureRequest, target: Path, draft: Path) -> Speculating:
    config = spec_config(request.param, draft)
    runner = ModelRunner(
        ModelConfig(model=str(target), num_threads=1),
        CacheConfig(block_size=BLOCK_SIZE, num_blocks=128),
        config,
        kernels=KERNELS,
    )
    return Speculating(runner, config)


@pytest.fixture(scope="module")
def ref(target: Path) -> HFReference:
    return HFReference(target)


@pytest.fixture(scope="module")
def corpus(target: Path) -> list[int]:
    from transformers import AutoConfig

    return random_corpus(AutoConfig.from_pretrained(target).vocab_size)


def spec_core(runner: StepRunner, speculative: SpeculativeConfig | None) -> EngineCore:
    """A fresh core; speculative=None schedules plain decodes on the same runner."""
    config = EngineConfig(
        model=ModelConfig(model="preloaded"),
        cache=CacheConfig(block_size=BLOCK_SIZE),
        scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=512),
        speculative=speculative,
    )
    return EngineCore(config, runner)


def repetitive(corpus: list[int], i: int) -> list[int]:
    """A prompt that repeats a phrase, so prompt lookup has something to find."""
    phrase = corpus[20 * i : 20 * i + 7]
    return [*corpus[200 + i : 205 + 2 * i], *phrase, *corpus[300 : 303 + i], *phrase, *phrase[:3]]


def prompts_of(corpus: list[int]) -> dict[str, list[int]]:
    return {f"p{i}": repetitive(corpus, i) for i in range(4)}


def greedy(speculate: bool | None) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, speculate=speculate)


def assert_speculated(run: EngineRun) -> None:
    """Drafts were proposed, some accepted and some rejected."""
    stats = run.stats
    assert stats is not None
    assert stats.spec_decode_num_drafts > 0
    assert 0 < stats.spec_decode_num_accepted_tokens < stats.spec_decode_num_draft_tokens


def test_greedy_equals_plain_decoding_in_a_mixed_batch(
    spec: Speculating, ref: HFReference, corpus: list[int]
) -> None:
    prompts = prompts_of(corpus)
    both = {**prompts, **{f"{rid}-plain": ids for rid, ids in prompts.items()}}
    params = {rid: greedy(not rid.endswith("-plain")) for rid in both}
    run = run_core(spec_core(spec.runner, spec.config), both, params)
    assert_speculated(run)
    for rid, ids in prompts.items():
        assert run.tokens[rid] == run.tokens[f"{rid}-plain"] == ref.greedy(ids, MAX_TOKENS), rid
    assert run.stats is not None
    assert run.stats.num_free_blocks == spec.runner.num_kv_blocks


def test_preemption_mid_speculation_keeps_the_tokens(spec: Speculating, corpus: list[int]) -> None:
    prompts = prompts_of(corpus)
    plain = run_core(spec_core(spec.runner, None), prompts, greedy(False))
    num_blocks = sum(-(-len(p) // BLOCK_SIZE) for p in prompts.values()) + 2
    core = spec_core(BlockLimit(spec.runner, num_blocks), spec.config)
    run = run_core(core, prompts, greedy(True))
    assert run.stats is not None
    assert run.stats.num_preemptions > 0
    assert_speculated(run)
    assert run.tokens == plain.tokens
    assert run.stats.num_free_blocks == num_blocks


def test_abort_mid_speculation_frees_its_blocks(spec: Speculating, corpus: list[int]) -> None:
    prompts = prompts_of(corpus)
    plain = run_core(spec_core(spec.runner, None), {"p1": prompts["p1"]}, greedy(False))
    core = spec_core(spec.runner, spec.config)
    for rid in ("p0", "p1"):
        core.add_request(
            EngineRequest(
                request_id=rid, prompt_token_ids=prompts[rid], sampling_params=greedy(True)
            )
        )
    tokens: list[int] = []
    while core.stats().spec_decode_num_drafts < 2:
        tokens += [t for o in core.step() if o.request_id == "p1" for t in o.new_token_ids]
    core.abort_requests(["p0"])
    while core.has_unfinished_requests():
        tokens += [t for o in core.step() if o.request_id == "p1" for t in o.new_token_ids]
    assert tokens == plain.tokens["p1"]
    assert core.stats().num_free_blocks == spec.runner.num_kv_blocks


def test_a_stop_string_inside_an_accepted_run(target: Path, corpus: list[int]) -> None:
    # a draft identical to the target: every proposal is accepted, every step yields k + 1
    llm = LLM(
        str(target),
        num_threads=1,
        num_blocks=64,
        speculative={"method": "draft", "draft_model": str(target), "num_speculative_tokens": 6},
    )
    prompt = repetitive(corpus, 2)
    llm.core.add_request(
        EngineRequest(request_id="runs", prompt_token_ids=prompt, sampling_params=greedy(True))
    )
    outputs: list[list[int]] = []
    while llm.core.has_unfinished_requests():
        outputs += [o.new_token_ids for o in llm.core.step()]
    tokens = [t for out in outputs for t in out]
    stop, cut = _stop_inside_a_run(llm, outputs)
    results = {
        speculate: llm.generate([prompt], msgspec.structs.replace(greedy(speculate), stop=[stop]))[
            0
        ]
        for speculate in (True, False)
    }
    assert results[True].token_ids == results[False].token_ids == tokens[:cut]
    assert results[True].text == results[False].text
    assert results[True].completions[0].stop_reason == stop


def _stop_inside_a_run(llm: LLM, outputs: list[list[int]]) -> tuple[str, int]:
    """A stop string that first occurs in the text of a token that is not the first of its
    step's output (so it is inside an accepted run); and how many tokens end with it."""
    tokens = [t for out in outputs for t in out]
    text = llm.tokenizer.decode(tokens)
    index = 0
    for out in outputs:
        for j in range(1, len(out)):
            before = llm.tokenizer.decode(tokens[: index + j])
            piece = llm.tokenizer.decode(tokens[: index + j + 1])[len(before) :].strip()
            if len(piece) >= 2 and text.find(piece) >= len(before) - 1 >= 0:
                return piece, index + j + 1
        index += len(out)
    raise AssertionError(f"no usable run in {outputs}")


def _chi_square_limit(df: int, z: float = 3.09) -> float:
    """The chi-square quantile at p = 0.001 (Wilson-Hilferty)."""
    return float(df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3)


def _distribution(ref: HFReference, ids: list[int], params: SamplingParams) -> torch.Tensor:
    logits = ref.next_logits(ids, "float32") / params.temperature
    kth = logits.topk(params.top_k).values[-1]
    return torch.softmax(logits.masked_fill(logits < kth, float("-inf")), 0)


def test_sampled_outputs_keep_the_target_distribution(
    target: Path, draft: Path, ref: HFReference, corpus: list[int]
) -> None:
    config = spec_config("draft", draft, num_speculative_tokens=2)
    runner = ModelRunner(
        ModelConfig(model=str(target), num_threads=1),
        CacheConfig(block_size=BLOCK_SIZE, num_blocks=160),
        config,
        kernels=KERNELS,
    )
    prompt = corpus[:9]
    params = SamplingParams(temperature=0.8, top_k=5, max_tokens=3, speculate=True)
    n = 1200
    run = run_core(spec_core(runner, config), {f"s{i}": prompt for i in range(n)}, params)
    assert run.stats is not None
    accepted = run.stats.spec_decode_num_accepted_tokens / run.stats.spec_decode_num_draft_tokens
    assert run.stats.spec_decode_num_drafts == n  # the second token of each was verified
    assert 0.1 < accepted < 0.9
    p1 = _distribution(ref, prompt, params)
    p2 = torch.zeros_like(p1)
    p3 = torch.zeros_like(p1)
    for t1 in p1.nonzero().flatten().tolist():
        q2 = _distribution(ref, [*prompt, t1], params)
        p2 += p1[t1] * q2
        for t2 in q2.nonzero().flatten().tolist():
            p3 += p1[t1] * q2[t2] * _distribution(ref, [*prompt, t1, t2], params)
    for position, expected in ((1, p2), (2, p3)):
        counts = torch.bincount(
            torch.tensor([tokens[position] for tokens in run.tokens.values()]),
            minlength=expected.numel(),
        ).double()
        big = expected * n >= 5
        observed = torch.cat([counts[big], counts[~big].sum().unsqueeze(0)])
        wanted = torch.cat([expected[big] * n, (expected[~big].sum() * n).unsqueeze(0)]).double()
        keep = wanted > 0
        chi2 = float(((observed[keep] - wanted[keep]) ** 2 / wanted[keep]).sum())
        assert chi2 < _chi_square_limit(int(keep.sum()) - 1), (position, chi2)


def test_self_draft_is_the_targets_first_layers_then_its_norm_and_head(
    target: Path, corpus: list[int]
) -> None:
    from transformers import AutoModelForCausalLM

    from modelyard.runner.attention import AttentionMetadata
    from modelyard.runner.spec_decode.draft import self_draft_model

    runner = ModelRunner(
        ModelConfig(model=str(target), num_threads=1), CacheConfig(num_blocks=8), kernels=KERNELS
    )
    assert runner._native is not None
    ids = corpus[:20]
    meta = AttentionMetadata.build([0], [len(ids)], [[0, 1]], BLOCK_SIZE)
    with torch.inference_mode():
        ours = self_draft_model(runner._native, 1).forward(
            torch.tensor(ids), meta, torch.arange(len(ids))
        )
        hf = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
        hidden = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states[1][0]
        expected = hf.lm_head(hf.model.norm(hidden))  # after layer 0 only
    assert torch.allclose(ours, expected, atol=1e-4)


def test_constrained_greedy_speculation_equals_plain_decoding(
    spec: Speculating, corpus: list[int]
) -> None:
    """Drafts of constrained requests are verified against their grammar's masked rows: the
    tokens are those of plain constrained decoding (permissive grammars accept drafts, strict
    ones reject most)."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    grammars = {
        "p0": constraints.regex(r"(.|\n){24,200}"),
        "p1": constraints.regex(r"[a-z ]{10,30}"),
        "p2": constraints.json_schema(schema),
        "p3": None,
    }

    def params(speculate: bool) -> dict[str, SamplingParams]:
        return {
            rid: msgspec.structs.replace(greedy(speculate), constraint=grammar)
            for rid, grammar in grammars.items()
        }

    prompts = prompts_of(corpus)
    plain = run_core(spec_core(spec.runner, None), prompts, params(False))
    run = run_core(spec_core(spec.runner, spec.config), prompts, params(True))
    assert run.stats is not None
    assert run.stats.spec_decode_num_drafts > 0
    assert run.tokens == plain.tokens
