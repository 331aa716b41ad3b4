"""Verification of proposed tokens against the target's logits (the rejection sampler).

A request that ran [last, d1..dj] gets j + 1 rows of target logits: row p is the target's
next-token distribution P_p after the request's tokens and d1..dp. Every proposer here is
deterministic (n-gram lookup, a draft's argmax), so the draft distribution is a point mass on
d_{p+1} and the standard rule (Leviathan et al. 2023; Chen et al. 2023) becomes, from p = 0:

- greedy: accept d_{p+1} while it equals argmax P_p; the first mismatch position's argmax is the
  output token (the correction); if all j match, argmax P_j is the bonus token. The tokens are
  exactly those of plain greedy decoding, because each row's logits are those a plain decode
  step computes for the same tokens;
- sampled: accept d_{p+1} with probability P_p(d_{p+1}); at the first rejection draw from P_p
  with d_{p+1} removed and renormalized (the residual max(P - Q, 0) for a point mass Q); if all
  j are accepted, draw the bonus from P_j. Each output token is then distributed as P.

P is exactly the distribution plain sampling draws from (`Sampler.target_distributions` goes
through the sampler's own steps: min_tokens, penalties, temperature, top-k, top-p, min-p,
renormalised), with the drafts before row p counted as output. Seeded requests draw from their
own generator.

A request never fails because it speculated:
- a draft token outside the vocabulary has probability 0 (rejected);
- an empty residual means P_p is the point mass on the draft (rejection has probability 0, the
  uniform passed P_p(d) only by rounding): the draft is accepted;
- a sampled request with a row that cannot be drawn from (NaN, or summing to 0) falls back to
  plain decoding for the step: its first row is sampled by `Sampler.sample`, no draft accepted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from modelyard.engine.core.scheduler_output import ScheduledRequest
from modelyard.runner.sampler import Sampler, draw_one


def verify(
    sampler: Sampler,
    logits: torch.Tensor,
    requests: Sequence[ScheduledRequest],
    drafts: Sequence[Sequence[int]],
) -> list[tuple[int, int]]:
    """logits (sum(len(d) + 1), V): request i's rows in order. -> (num accepted, the target's
    token after them) per request."""
    rows = [_row(req, draft, p) for req, draft in zip(requests, drafts, strict=True)
            for p in range(len(draft) + 1)]  # fmt: skip
    targets, probs = sampler.target_distributions(logits, rows)
    target_ids = targets.tolist()
    usable = _usable_rows(probs)
    out: list[tuple[int, int]] = []
    fallback: list[int] = []  # requests sampled plainly from their first row
    first = 0
    for i, (req, draft) in enumerate(zip(requests, drafts, strict=True)):
        span = slice(first, first + len(draft) + 1)
        if req.sampling_params.greedy or probs is None:
            out.append(_accept_greedy(draft, target_ids[span]))
        elif all(usable[span]):
            out.append(_accept_sampled(draft, probs[span], sampler.generator(req)))
        else:
            out.append((0, -1))  # filled below
            fallback.append(i)
        first = span.stop
    if fallback:
        _sample_first_rows(sampler, logits, requests, drafts, fallback, out)
    return out


def _row(request: ScheduledRequest, draft: Sequence[int], position: int) -> ScheduledRequest:
    """The request as the sampler sees it at draft row `position` (the drafts before it count
    as output)."""
    if position == 0:
        return request
    output = [*request.output_token_ids, *draft[:position]]
    return dataclasses.replace(request, output_token_ids=output)


def _usable_rows(probs: torch.Tensor | None) -> list[bool]:
    """Per row of probs (N, V): whether a token can be drawn from it (finite, positive sum)."""
    if probs is None:
        return []
    return [bool(ok) for ok in (torch.isfinite(probs).all(dim=-1) & (probs.sum(dim=-1) > 0))]


def _accept_greedy(draft: Sequence[int], targets: Sequence[int]) -> tuple[int, int]:
    for p, token in enumerate(draft):
        if targets[p] != token:
            return p, targets[p]
    return len(draft), targets[len(draft)]


def _accept_sampled(
    draft: Sequence[int], probs: torch.Tensor, generator: torch.Generator | None
) -> tuple[int, int]:
    """probs (len(draft) + 1, V): the target's distribution at each row (usable rows)."""
    vocab = probs.shape[1]
    for p, token in enumerate(draft):
        inside = 0 <= token < vocab
        u = float(torch.rand((), generator=generator))
        if inside and u < float(probs[p, token]):
            continue
        residual = probs[p].clone()
        if inside:
            residual[token] = 0.0
        if float(residual.sum()) <= 0.0:  # P_p is the point mass on the draft
            continue
        return p, draw_one(residual, generator)
    return len(draft), draw_one(probs[len(draft)], generator)


def _sample_first_rows(
    sampler: Sampler,
    logits: torch.Tensor,
    requests: Sequence[ScheduledRequest],
    drafts: Sequence[Sequence[int]],
    fallback: list[int],
    out: list[tuple[int, int]],
) -> None:
    """Plain decoding for the `fallback` requests: their first row sampled, no draft accepted
    (written into `out`)."""
    starts = [0]
    for draft in drafts:
        starts.append(starts[-1] + len(draft) + 1)
    first_rows = torch.tensor([starts[i] for i in fallback], dtype=torch.long)
    tokens, _ = sampler.sample(logits[first_rows], [requests[i] for i in fallback])
    for i, token in zip(fallback, tokens, strict=True):
        out[i] = (0, token)
