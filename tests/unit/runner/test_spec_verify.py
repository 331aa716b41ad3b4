"""Speculative decoding's runner pieces on hand-made inputs: prompt lookup, greedy
verification, and the rejection rule's output distribution (exact, computed from the
acceptance probabilities, and by sampling)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from modelyard.engine.core.scheduler_output import ScheduledRequest
from modelyard.engine.sampling_params import SamplingParams
from modelyard.runner.sampler import Sampler
from modelyard.runner.spec_decode.ngram import NgramProposer, lookup
from modelyard.runner.spec_decode.verify import verify

pytestmark = pytest.mark.unit

EOS = 7


def _req(rid: str = "r", output: list[int] | None = None, **params: object) -> ScheduledRequest:
    return ScheduledRequest(
        request_id=rid,
        token_ids=[1],
        start_position=4,
        block_table=[0],
        sample=True,
        sampling_params=SamplingParams(**params).validate(),  # type: ignore[arg-type]
        prompt_token_ids=[0, 1, 2, 3],
        output_token_ids=output or [],
        num_spec_tokens=3,
    )


def _lookup(tokens: list[int], k: int = 3, min_n: int = 1, max_n: int = 3) -> list[int]:
    return lookup(np.array(tokens, dtype=np.int64), min_n, max_n, k)


@pytest.mark.parametrize(
    ("tokens", "k", "expected"),
    [
        ([1, 2, 3, 4, 2, 3], 4, [4, 2, 3]),  # vLLM's example: [2, 3] matched, 3 tokens follow
        ([5, 1, 2, 9, 1, 2, 8, 1, 2], 2, [9, 1]),  # the earliest of equal matches
        ([1, 2, 3, 7, 2, 3, 8, 1, 2, 3], 3, [7, 2, 3]),  # the longest n wins ([1, 2, 3])
        ([1, 2, 3, 4], 3, []),  # no earlier occurrence
        ([4], 3, []),
        ([6, 6, 6], 3, [6]),  # overlapping matches
    ],
)
def test_prompt_lookup(tokens: list[int], k: int, expected: list[int]) -> None:
    assert _lookup(tokens, k) == expected


def test_min_n_is_respected_and_the_proposer_reads_prompt_and_output() -> None:
    assert _lookup([1, 2, 9, 2], min_n=2) == []
    proposer = NgramProposer(2, 3)
    req = _req(output=[1, 2])  # tokens 0 1 2 3 1 2: [1, 2] seen at 1 -> 3 1 2
    assert proposer.propose([req]) == {"r": [3, 1, 2]}
    assert proposer.propose([_req(output=[9])]) == {}


def _one_hot_logits(tokens: list[int], vocab: int = 8) -> torch.Tensor:
    logits = torch.zeros(len(tokens), vocab)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return logits


def test_greedy_keeps_drafts_while_they_equal_the_argmax() -> None:
    sampler = Sampler([EOS])
    reqs = [_req("a", temperature=0.0), _req("b", temperature=0.0), _req("c", temperature=0.0)]
    drafts = [[3, 4, 5], [3, 6, 5], []]
    # target argmax per row: a 3 4 5 6 (all accepted + bonus 6); b 3 4 .. (rejects 6 -> 4)
    logits = _one_hot_logits([3, 4, 5, 6, 3, 4, 0, 0, 2])  # a | b | c
    assert verify(sampler, logits, reqs, drafts) == [(3, 6), (1, 4), (0, 2)]


def test_greedy_verification_applies_penalties_with_the_drafts_as_output() -> None:
    sampler = Sampler([EOS])
    req = _req(temperature=0.0, presence_penalty=2.0)
    logits = torch.zeros(3, 8)
    logits[:, 3] = 1.5  # the argmax until 3 is in the output
    logits[:, 2] = 1.0
    # row 0: 3 (accept draft 3); row 1: 3 penalized to -0.5 -> 2 (rejects draft 3)
    assert verify(sampler, logits, [req], [[3, 3]]) == [(1, 2)]


def _exact_distribution(target: torch.Tensor, draft: int) -> torch.Tensor:
    """The rule's output distribution of the first token for a point-mass draft."""
    accept = target[draft]
    residual = target.clone()
    residual[draft] = 0
    out = (1 - accept) * residual / residual.sum()
    out[draft] += accept
    return out


def test_rejection_rule_is_exactly_the_target_distribution() -> None:
    torch.manual_seed(0)
    target = torch.softmax(torch.randn(8), 0)
    for draft in range(8):
        assert torch.allclose(_exact_distribution(target, draft), target, atol=1e-6)


def test_sampled_verification_draws_from_the_target_distribution() -> None:
    torch.manual_seed(1)
    logits_row = torch.randn(8)
    target = torch.softmax(logits_row, 0)
    draft = int(target.argmin())  # a poor draft: mostly rejected, the residual carries it
    n = 4000
    reqs = [_req(f"r{i}", temperature=1.0) for i in range(n)]
    logits = logits_row.repeat(2 * n, 1)  # each request: draft row + bonus row
    results = verify(Sampler([EOS]), logits, reqs, [[draft]] * n)
    first = Counter(draft if accepted else token for accepted, token in results)
    observed = torch.tensor([first[t] for t in range(8)], dtype=torch.float64)
    expected = target.double() * n
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 24.3  # chi-square, 7 degrees of freedom, p = 0.001


def test_seeded_verification_is_reproducible() -> None:
    logits = torch.randn(4, 8)
    first = verify(Sampler([EOS]), logits, [_req(seed=3)], [[1, 2, 3]])
    again = verify(Sampler([EOS]), logits, [_req(seed=3)], [[1, 2, 3]])
    assert first == again


def _first_tokens(results: list[tuple[int, int]], drafts: list[list[int]]) -> list[int]:
    """The first output token of each verified request."""
    return [
        draft[0] if accepted else token
        for (accepted, token), draft in zip(results, drafts, strict=True)
    ]


def _assert_fits(tokens: list[int], target: torch.Tensor) -> None:
    """The tokens fit the (V,) distribution: none outside its support, chi-square p = 0.001."""
    n = len(tokens)
    counts = torch.bincount(torch.tensor(tokens), minlength=target.numel()).double()
    expected = target.double() * n
    assert int(counts[expected == 0].sum()) == 0, counts
    kept = expected > 0
    chi2 = float(((counts[kept] - expected[kept]) ** 2 / expected[kept]).sum())
    limits = {0: 0.0, 1: 10.83, 2: 13.82, 3: 16.27}  # chi-square critical values, p = 0.001
    assert chi2 <= limits[int(kept.sum()) - 1], (chi2, counts, expected)


def _min_p_target(row: list[float], min_p: float) -> torch.Tensor:
    """softmax, tokens under min_p x the largest probability dropped, renormalised."""
    probs = torch.softmax(torch.tensor(row), 0)
    probs[probs < min_p * probs.max()] = 0.0
    return probs / probs.sum()


ROW = [0.0, 0.0, 3.0, 2.8, 1.0, 0.0, 0.0, 0.0]  # min_p 0.5 keeps 2 and 3, 0.9 keeps 2


@pytest.mark.parametrize("draft", [2, 3, 4])
def test_min_p_verification_draws_from_the_renormalised_target(draft: int) -> None:
    """min_p leaves rows that sum below 1: acceptance and residual use them renormalised."""
    torch.manual_seed(2)
    n = 3000
    reqs = [_req(f"r{i}", temperature=1.0, min_p=0.5) for i in range(n)]
    results = verify(Sampler([EOS]), torch.tensor(ROW).repeat(2 * n, 1), reqs, [[draft]] * n)
    _assert_fits(_first_tokens(results, [[draft]] * n), _min_p_target(ROW, 0.5))


def test_a_draft_that_min_p_keeps_alone_is_always_accepted() -> None:
    """min_p 0.9 keeps only token 2: its draft is accepted with probability 1 (no empty
    residual to draw from), any other draft rejected for 2."""
    n = 500
    reqs = [_req(f"r{i}", temperature=1.0, min_p=0.9) for i in range(n)]
    logits = torch.tensor(ROW).repeat(3 * n, 1)
    assert verify(Sampler([EOS]), logits, reqs, [[2, 2]] * n) == [(2, 2)] * n
    assert verify(Sampler([EOS]), logits, reqs, [[3, 2]] * n) == [(0, 2)] * n


def test_a_draft_outside_the_vocabulary_is_rejected() -> None:
    results = verify(Sampler([EOS]), torch.tensor(ROW).repeat(2, 1), [_req(min_p=0.9)], [[99]])
    assert results == [(0, 2)]


@pytest.mark.parametrize("bad_row", [float("nan"), float("-inf")])
def test_a_row_that_cannot_be_drawn_from_falls_back_to_plain_sampling(bad_row: float) -> None:
    """A NaN or all -inf bonus row: the request samples its first row plainly (0 accepted)
    instead of failing the step; its batch mate is verified as usual."""
    torch.manual_seed(3)
    n = 2000
    good = [0.0, 0.0, 6.0, 5.5, 4.0, 0.0, 0.0, 0.0]
    logits = torch.tensor(good).repeat(4 * n, 1)
    logits[1::4] = bad_row  # each "bad" request's bonus row; rows 2-3: its mate's
    reqs = [_req(f"{kind}{i}", min_p=0.1) for i in range(n) for kind in ("bad", "ok")]
    results = verify(Sampler([EOS]), logits, reqs, [[2]] * (2 * n))
    bad, ok = results[0::2], results[1::2]
    assert {accepted for accepted, _ in bad} == {0}
    _assert_fits([token for _, token in bad], _min_p_target(good, 0.1))
    assert {accepted for accepted, _ in ok} == {0, 1}
    _assert_fits(_first_tokens(ok, [[2]] * n), _min_p_target(good, 0.1))
