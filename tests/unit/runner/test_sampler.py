"""Sampler: each parameter's effect on hand-made logits, seeded reproducibility independent of
batch mates, and logprobs equal to log_softmax of the raw logits."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from modelyard.engine.config import kernels_from_environment
from modelyard.engine.core.scheduler_output import ScheduledRequest
from modelyard.engine.sampling_params import SamplingParams
from modelyard.runner import kernels
from modelyard.runner.sampler import Sampler, _native_draw

KERNELS = kernels_from_environment()  # the switches of this test run's environment

pytestmark = pytest.mark.unit

V = 8
EOS = 7


def _req(
    rid: str = "r",
    prompt: list[int] | None = None,
    output: list[int] | None = None,
    **params: object,
) -> ScheduledRequest:
    return ScheduledRequest(
        request_id=rid,
        token_ids=[1],
        start_position=0,
        block_table=[0],
        sample=True,
        sampling_params=SamplingParams(**params).validate(),  # type: ignore[arg-type]
        prompt_token_ids=prompt or [],
        output_token_ids=output or [],
    )


def _logits(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


BASE = [1.0, 3.0, 2.0, 0.5, 0.0, -1.0, 2.5, 2.9]


def _draws(req: ScheduledRequest, logits: list[float], n: int = 300) -> Counter[int]:
    torch.manual_seed(0)  # unseeded rows use the global generator: keep the test stable
    sampler = Sampler([EOS])
    batch = _logits(*([logits] * n))
    tokens, _ = sampler.sample(batch, [req] * n)
    return Counter(tokens)


def test_greedy_is_argmax_per_row() -> None:
    logits = _logits(BASE, list(reversed(BASE)))
    tokens, lps = Sampler([EOS]).sample(logits, [_req(temperature=0.0), _req(temperature=0.0)])
    assert tokens == [1, 6]
    assert lps == [None, None]


def test_min_tokens_masks_eos_and_stop_ids() -> None:
    logits = _logits(BASE, BASE)
    logits[:, EOS] = 10.0
    logits[:, 3] = 9.0
    reqs = [
        _req("a", output=[1], temperature=0.0, min_tokens=2, stop_token_ids=[3]),
        _req("b", output=[1, 1], temperature=0.0, min_tokens=2, stop_token_ids=[3]),
    ]
    tokens, _ = Sampler([EOS]).sample(logits, reqs)
    assert tokens == [1, EOS]  # a: EOS and 3 masked; b: reached min_tokens


def test_repetition_penalty_covers_prompt_and_output() -> None:
    tokens, _ = Sampler([EOS]).sample(
        _logits(BASE), [_req(prompt=[1], output=[7], temperature=0.0, repetition_penalty=2.0)]
    )
    assert tokens == [6]  # 1 (3.0 -> 1.5) and 7 (2.9 -> 1.45) penalised; 6 (2.5) wins


def test_negative_logits_are_multiplied_by_repetition_penalty() -> None:
    logits = _logits([-1.0, -1.5, -9, -9, -9, -9, -9, -9])
    tokens, _ = Sampler([EOS]).sample(
        logits, [_req(prompt=[0], temperature=0.0, repetition_penalty=2.0)]
    )
    assert tokens == [1]  # -1.0 * 2 = -2.0 < -1.5


def test_frequency_and_presence_penalties_use_output_only() -> None:
    sampler = Sampler([EOS])
    freq = _req(prompt=[6], output=[1, 1], temperature=0.0, frequency_penalty=0.1)
    assert sampler.sample(_logits(BASE), [freq])[0] == [7]  # 3.0 - 0.2 = 2.8 < 2.9
    pres = _req(prompt=[1], output=[7], temperature=0.0, presence_penalty=0.5)
    assert sampler.sample(_logits(BASE), [pres])[0] == [1]  # prompt tokens are not penalised


def test_top_k_keeps_only_k_tokens() -> None:
    seen = _draws(_req(temperature=1.0, top_k=2), BASE)
    assert set(seen) <= {1, 7}
    assert len(seen) == 2


def test_top_p_keeps_the_nucleus() -> None:
    logits = [5.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # p(0)=0.72, p(1)=0.27
    seen = _draws(_req(temperature=1.0, top_p=0.8), logits)
    assert set(seen) == {0, 1}


def test_min_p_drops_unlikely_tokens() -> None:
    logits = [5.0, 4.5, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # p(2)/p(0) = e^-3 = 0.05
    seen = _draws(_req(temperature=1.0, min_p=0.1), logits)
    assert set(seen) == {0, 1}


def test_low_temperature_concentrates_and_high_spreads() -> None:
    cold = _draws(_req(temperature=0.01), BASE)  # 3.0 vs 2.9: e^-10 apart
    hot = _draws(_req(temperature=5.0), BASE)
    assert cold[1] >= 290
    assert len(hot) >= 6


def test_seed_is_reproducible_whatever_the_batch_mates() -> None:
    def run(mates: int) -> list[int]:
        sampler = Sampler([EOS])
        out = []
        for _ in range(10):
            reqs = [_req(f"m{i}", temperature=1.0) for i in range(mates)]
            reqs.insert(mates // 2, _req("seeded", temperature=1.0, seed=42))
            logits = torch.randn(len(reqs), V)
            logits[mates // 2] = torch.tensor(BASE)
            tokens, _ = sampler.sample(logits, reqs)
            out.append(tokens[mates // 2])
        return out

    alone = run(0)
    assert run(5) == alone
    assert run(2) == alone
    assert len(set(alone)) > 1  # it does sample, not argmax


def test_seeded_generator_continues_across_steps_and_is_forgotten() -> None:
    sampler = Sampler([EOS])
    req = _req("s", temperature=1.0, seed=7)
    first = [sampler.sample(_logits(BASE), [req])[0][0] for _ in range(8)]
    sampler.forget(["s"])
    again = [sampler.sample(_logits(BASE), [req])[0][0] for _ in range(8)]
    assert again == first  # a fresh generator restarts the same stream
    other = Sampler([EOS])
    assert [
        other.sample(_logits(BASE), [_req("s", temperature=1.0, seed=8)])[0][0] for _ in range(8)
    ] != first


def test_logprobs_are_log_softmax_of_raw_logits() -> None:
    logits = _logits(BASE, BASE)
    reqs = [
        _req("a", temperature=0.0, logprobs=3, repetition_penalty=2.0, prompt=[1]),
        _req("b", temperature=0.0, logprobs=0),
    ]
    tokens, lps = Sampler([EOS]).sample(logits, reqs)
    ref = torch.log_softmax(torch.tensor(BASE), dim=-1)
    a, b = lps
    assert a is not None
    assert b is not None
    assert a.token_id == tokens[0] == 7  # penalty changed the choice, not the logprobs
    assert a.logprob == pytest.approx(float(ref[7]))
    assert a.top_token_ids == [1, 7, 6]
    assert a.top_logprobs == pytest.approx([float(ref[i]) for i in (1, 7, 6)])
    assert b.token_id == 1
    assert b.top_token_ids == []
    assert b.logprob == pytest.approx(float(ref[1]))


def test_draws_follow_the_probabilities_chi_square() -> None:
    """Temperature 1: over 20,000 draws the token counts fit softmax(logits) (chi-square, 7
    degrees of freedom, 24.3 is the 0.1 % critical value), and top_k masks the rest exactly."""
    torch.manual_seed(0)
    row = [2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, 0.2]
    expected = torch.softmax(torch.tensor(row), dim=-1)
    sampler = Sampler([EOS])
    counts: Counter[int] = Counter()
    batch = [_req(f"r{i}", temperature=1.0) for i in range(2000)]
    for _ in range(10):
        tokens, _ = sampler.sample(_logits(*[row] * len(batch)), batch)
        counts.update(tokens)
    n = sum(counts.values())
    chi2 = sum((counts[t] - n * float(p)) ** 2 / (n * float(p)) for t, p in enumerate(expected))
    assert chi2 < 24.3, (chi2, counts)
    top2 = [_req(f"k{i}", temperature=1.0, top_k=2) for i in range(2000)]
    tokens, _ = sampler.sample(_logits(*[row] * len(top2)), top2)
    assert set(tokens) == {0, 6}


needs_kernels = pytest.mark.skipif(not kernels.load(KERNELS), reason="compiled kernels not built")


def _reference_draw(logits: torch.Tensor, inv_t: torch.Tensor, uniform: torch.Tensor) -> list[int]:
    """The inverse-CDF rule in float64: the first token whose cumulative probability passes u."""
    probs = torch.softmax(logits.double() * inv_t.double().unsqueeze(1), dim=-1)
    cdf = probs.cumsum(dim=-1)
    target = (uniform * cdf[:, -1]).unsqueeze(1)
    return [int(t) for t in torch.searchsorted(cdf, target, right=True).squeeze(1)]


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_draw_inverts_the_cdf_like_the_torch_rule(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    rows, vocab = 64, 49157  # several chunks and a ragged tail
    logits = (torch.randn(rows, vocab, generator=gen) * 3).to(dtype)
    logits[:, ::7] = float("-inf")  # masked tokens
    inv_t = torch.rand(rows, generator=gen) * 2 + 0.25
    uniform = torch.rand(rows, generator=gen, dtype=torch.float64)
    got = _native_draw(logits.contiguous(), inv_t, uniform).tolist()
    want = _reference_draw(logits.float(), inv_t, uniform)
    probs = torch.softmax(logits.double() * inv_t.double().unsqueeze(1), dim=-1)
    cdf = probs.cumsum(dim=-1) / probs.sum(dim=-1, keepdim=True)
    for r in range(rows):
        if got[r] != want[r]:  # only where u sits within float rounding of a CDF step
            assert abs(float(cdf[r, min(got[r], want[r])]) - float(uniform[r])) < 1e-5
        assert got[r] % 7 != 0  # a masked token is never drawn


@needs_kernels
def test_native_draw_never_takes_a_zero_probability_token() -> None:
    vocab = 49152
    logits = torch.full((3, vocab), float("-inf"))
    logits[:, [5, 700, vocab - 1]] = torch.tensor([0.0, 1.0, 2.0])
    uniform = torch.tensor([0.0, 0.5, 1.0 - 1e-12], dtype=torch.float64)
    got = _native_draw(logits, torch.ones(3), uniform).tolist()
    assert got[0] == 5
    assert got[2] == vocab - 1
    assert got[1] in (700, vocab - 1)
    # 90 below the maximum after scaling: probability 0 (exp < 1.6e-38)
    far = torch.tensor([[0.0, -90.0, -200.0]])
    draws = {
        int(_native_draw(far, torch.ones(1), torch.tensor([u], dtype=torch.float64))[0])
        for u in (0.0, 0.5, 1.0 - 1e-12)
    }
    assert draws == {0}


@needs_kernels
def test_native_draw_of_a_non_finite_row_is_its_argmax() -> None:
    nan_row = [0.0] * 20
    nan_row[11] = float("nan")  # in the vector part of the row
    logits = torch.tensor(
        [[float("-inf")] * 20, [0.0, float("inf"), 1.0, 2.0] * 5, nan_row, [0.0] * 19 + [math.nan]]
    )
    got = _native_draw(logits, torch.ones(4), torch.full((4,), 0.5, dtype=torch.float64))
    assert got.tolist() == [0, 1, 11, 19]


FILTERS = {
    "top_k": {"top_k": 3},
    "top_p": {"top_p": 0.6},
    "min_p": {"min_p": 0.3},
    "combined": {"temperature": 0.7, "top_k": 5, "top_p": 0.9, "min_p": 0.1},
    "penalties": {"repetition_penalty": 1.5, "frequency_penalty": 0.4, "presence_penalty": 0.3},
    "min_tokens": {"min_tokens": 3, "stop_token_ids": [1], "min_p": 0.2},
}


@pytest.mark.parametrize("params", FILTERS.values(), ids=FILTERS.keys())
def test_target_distributions_are_what_sample_draws_from(params: dict[str, object]) -> None:
    """Speculative verification reads target_distributions: each row sums to 1, and 4,000 plain
    draws fit it (chi-square, p = 0.001)."""
    torch.manual_seed(0)
    row = [1.0, 3.0, 2.0, 0.5, 0.0, -1.0, 2.5, 2.9]
    req = _req(prompt=[1, 2], output=[6, 6], **{"temperature": 1.0, **params})
    sampler = Sampler([EOS])
    _, probs = sampler.target_distributions(_logits(row), [req])
    assert probs is not None
    assert float(probs.sum()) == pytest.approx(1.0, abs=1e-6)
    n = 4000
    tokens, _ = sampler.sample(_logits(*[row] * n), [req] * n)
    counts = torch.bincount(torch.tensor(tokens), minlength=V).double()
    expected = probs[0].double() * n
    assert int(counts[expected == 0].sum()) == 0  # nothing outside the filters
    kept = expected > 0
    chi2 = float(((counts[kept] - expected[kept]) ** 2 / expected[kept]).sum())
    assert chi2 < _chi_square_limit(int(kept.sum()) - 1), (chi2, counts, expected)


def _chi_square_limit(df: int, z: float = 3.09) -> float:
    """The chi-square quantile at p = 0.001 (Wilson-Hilferty); 10.8 for one degree of freedom."""
    if df <= 1:
        return 10.83
    return float(df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3)
