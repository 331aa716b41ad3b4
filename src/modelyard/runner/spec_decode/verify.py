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

P is the distribution the sampler would draw from (penalties, min_tokens, temperature, top-k,
top-p, min-p applied with the drafts before row p counted as output). Seeded requests draw
from their own generator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from modelyard.engine.scheduler_output import ScheduledRequest
from modelyard.runner.sampler import Sampler


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
    out: list[tuple[int, int]] = []
    first = 0
    for req, draft in zip(requests, drafts, strict=True):
        if req.sampling_params.greedy or probs is None:
            out.append(_accept_greedy(draft, target_ids[first : first + len(draft) + 1]))
        else:
            span = probs[first : first + len(draft) + 1]
            out.append(_accept_sampled(draft, span, sampler.generator(req)))
        first += len(draft) + 1
    return out


def _row(request: ScheduledRequest, draft: Sequence[int], position: int) -> ScheduledRequest:
    """The request as the sampler sees it at draft row `position` (the drafts before it count
    as output)."""
    if position == 0:
        return request
    output = [*request.output_token_ids, *draft[:position]]
    return dataclasses.replace(request, output_token_ids=output)


def _accept_greedy(draft: Sequence[int], targets: Sequence[int]) -> tuple[int, int]:
    for p, token in enumerate(draft):
        if targets[p] != token:
            return p, targets[p]
    return len(draft), targets[len(draft)]


def _accept_sampled(
    draft: Sequence[int], probs: torch.Tensor, generator: torch.Generator | None
) -> tuple[int, int]:
    """probs (len(draft) + 1, V): the target's distribution at each row."""
    for p, token in enumerate(draft):
        u = float(torch.rand((), generator=generator))
        if u < float(probs[p, token]):
            continue
        residual = probs[p].clone()
        residual[token] = 0.0
        return p, int(torch.multinomial(residual, 1, generator=generator)[0])
    bonus = torch.multinomial(probs[len(draft)], 1, generator=generator)
    return len(draft), int(bonus[0])
