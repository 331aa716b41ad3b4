"""Structured output on a tiny byte-level vocabulary (token id = byte value, 256 = EOS): the
grammar cache compiles once per constraint, matchers follow (and roll back with) the output,
masks touch only the constrained rows, and the sampler draws from the constrained
distribution."""

from __future__ import annotations

import json
import math

import llguidance
import llguidance.hf
import pytest
import torch

from grammar_helpers import EOS, byte_tokenizer
from grammar_helpers import VOCAB as V
from modelyard.engine import constraints
from modelyard.engine.constraints import Constraint, ConstraintError
from modelyard.engine.core.scheduler_output import ScheduledRequest
from modelyard.engine.sampling_params import SamplingParams
from modelyard.runner.sampler import Sampler
from modelyard.runner.structured import GrammarCache, StructuredOutputs, TokenMasks, apply_masks
from modelyard.runner.structured.masks import allowed_tokens

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tokenizer() -> llguidance.LLTokenizer:
    return byte_tokenizer()


def _req(rid: str, output: list[int], constraint: Constraint | None) -> ScheduledRequest:
    return ScheduledRequest(
        request_id=rid,
        token_ids=[1],
        start_position=0,
        block_table=[0],
        sample=True,
        sampling_params=SamplingParams(temperature=0.0, constraint=constraint, logprobs=2),
        prompt_token_ids=[1],
        output_token_ids=output,
    )


def _allowed(masks: TokenMasks, row: int) -> set[int]:
    return set(allowed_tokens(masks.bitmask, V)[row].nonzero().flatten().tolist())


def _structured(tokenizer: llguidance.LLTokenizer) -> StructuredOutputs:
    return StructuredOutputs(lambda: tokenizer)


def test_cache_compiles_each_constraint_once_and_stays_bounded(
    tokenizer: llguidance.LLTokenizer,
) -> None:
    cache = GrammarCache(tokenizer, capacity=2)
    a, b, c = constraints.regex("a+"), constraints.choice(["x", "y"]), constraints.json_object()
    cache.matcher(a)
    cache.matcher(constraints.regex("a+"))  # equal constraint: same grammar
    assert cache.compiles == 1
    cache.matcher(b)
    cache.matcher(a)  # a is now the most recent
    cache.matcher(c)  # evicts b
    assert (len(cache), cache.compiles) == (2, 3)
    cache.matcher(a)
    assert cache.compiles == 3
    cache.matcher(b)
    assert cache.compiles == 4
    with pytest.raises(ConstraintError):
        cache.matcher(constraints.regex("a(b"))


def test_canonical_schema_text_makes_equal_constraints() -> None:
    one = constraints.json_schema({"type": "object", "required": ["a"], "properties": {}})
    two = constraints.json_schema(
        json.loads('{"type":"object", "required": ["a"],"properties":{}}')
    )
    assert one == two
    assert hash(one) == hash(two)
    assert one.spec == '{"type":"object","required":["a"],"properties":{}}'  # order kept


@pytest.mark.parametrize(
    ("constraint", "error"),
    [
        (constraints.json_schema({"type": "array", "uniqueItems": True}), "uniqueItems"),
        (constraints.regex("a(b"), "unclosed group"),
        (constraints.grammar("start: foo"), "unknown name"),
        (constraints.choice([]), "at least one"),
    ],
)
def test_check_names_the_problem(constraint: Constraint, error: str) -> None:
    with pytest.raises(ConstraintError, match=error):
        constraints.check(constraint)


def test_matcher_follows_the_output_and_rolls_back(tokenizer: llguidance.LLTokenizer) -> None:
    structured = _structured(tokenizer)
    choice = constraints.choice(["yes", "no"])
    output: list[int] = []
    req = _req("r", output, choice)
    assert _allowed(structured.masks([0], [req]), 0) == {ord("y"), ord("n")}
    output += [ord("y"), ord("e")]
    assert _allowed(structured.masks([0], [req]), 0) == {ord("s")}
    output.append(ord("s"))
    assert _allowed(structured.masks([0], [req]), 0) == {EOS}  # the grammar accepts: only EOS
    del output[1:]  # a re-run with a shorter output: the matcher rolls back
    assert _allowed(structured.masks([0], [req]), 0) == {ord("e")}
    structured.forget(["r"])
    assert structured.stats.constrained_requests == 1
    output[:] = [ord("x")]  # a token the grammar forbids (never sampled through a mask)
    with pytest.raises(ConstraintError):
        structured.masks([0], [req])


def test_start_masks_only_the_constrained_rows(tokenizer: llguidance.LLTokenizer) -> None:
    structured = _structured(tokenizer)
    batch = [_req("free", [], None), _req("re", [], constraints.regex("[0-9]{2}"))]
    masks = structured.start(batch).result().plain
    assert masks is not None
    assert masks.rows == [1]
    assert _allowed(masks, 0) == {ord(d) for d in "0123456789"}
    assert structured.start([_req("free", [], None)]).result().plain is None
    structured.close()


def test_sampler_draws_from_the_constrained_distribution(
    tokenizer: llguidance.LLTokenizer,
) -> None:
    structured = _structured(tokenizer)
    batch = [_req("free", [], None), _req("c", [], constraints.choice(["b", "c"]))]
    torch.manual_seed(0)
    logits = torch.randn(2, V)
    logits[:, ord("a")] = 10.0  # the unconstrained favourite
    logits[1, ord("c")] = 5.0
    reference = logits.clone()
    masks = structured.masks([1], batch[1:])
    tokens, logprobs = Sampler([EOS]).sample(logits, batch, masks)
    assert tokens == [ord("a"), ord("c")]
    assert torch.equal(logits[0], reference[0])  # the free row is untouched
    free, constrained = logprobs
    assert free is not None
    assert constrained is not None
    assert free.logprob == pytest.approx(float(torch.log_softmax(reference[0], -1)[ord("a")]))
    pair = reference[1, [ord("b"), ord("c")]]
    assert constrained.logprob == pytest.approx(float(torch.log_softmax(pair, -1)[1]), abs=1e-5)
    assert math.exp(constrained.top_logprobs[0]) + math.exp(constrained.top_logprobs[1]) == (
        pytest.approx(1.0)
    )


def test_forbidden_tokens_are_not_listed_as_alternatives(
    tokenizer: llguidance.LLTokenizer,
) -> None:
    structured = _structured(tokenizer)
    batch = [_req("c", [], constraints.choice(["b"]))]  # one allowed token, two asked for
    masks = structured.masks([0], batch)
    _, (logprobs,) = Sampler([EOS]).sample(torch.randn(1, V), batch, masks)
    assert logprobs is not None
    assert (logprobs.token_id, logprobs.logprob) == (ord("b"), 0.0)
    assert logprobs.top_token_ids == [ord("b")]


def test_apply_masks_without_rows_is_a_no_op() -> None:
    logits = torch.randn(2, V)
    before = logits.clone()
    apply_masks(logits, TokenMasks(rows=[], bitmask=torch.zeros(0, 9, dtype=torch.int32)))
    assert torch.equal(logits, before)


def test_min_tokens_does_not_hold_back_a_complete_grammars_eos(
    tokenizer: llguidance.LLTokenizer,
) -> None:
    structured = _structured(tokenizer)
    req = _req("c", [ord("b")], constraints.choice(["b"]))
    req.sampling_params = SamplingParams(
        temperature=0.0, min_tokens=5, max_tokens=9, constraint=req.sampling_params.constraint
    )
    tokens, _ = Sampler([EOS]).sample(torch.randn(1, V), [req], structured.masks([0], [req]))
    assert tokens == [EOS]


def test_draft_rows_are_masked_per_prefix_and_leave_the_matcher_unchanged(
    tokenizer: llguidance.LLTokenizer,
) -> None:
    structured = _structured(tokenizer)
    free, req = _req("free", [], None), _req("c", [], constraints.choice(["yes", "no"]))
    draft = [ord("y"), ord("e"), ord("x"), ord("s")]  # "x" is not grammatical
    masks = structured.start([], [(free, [5]), (req, draft)]).result()
    assert masks.plain is None
    assert masks.drafts is not None
    assert masks.drafts.rows == [2, 3, 4, 5, 6]  # after the free request's 2 rows
    assert _allowed(masks.drafts, 0) == {ord("y"), ord("n")}
    assert _allowed(masks.drafts, 1) == {ord("e")}
    assert _allowed(masks.drafts, 2) == {ord("s")}  # decides "x": rejected
    assert _allowed(masks.drafts, 3) == set(range(V))  # never reached
    assert _allowed(structured.masks([0], [req]), 0) == {ord("y"), ord("n")}
    structured.close()
