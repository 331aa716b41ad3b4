"""Per-request sampling over one batch of logits.

`Sampler.sample(logits, requests)` turns the logits of the sampled positions (one row per
request with sample=True) into one token per row. Steps, in order (vLLM Sampler style):

0. Structured output: the rows with an output constraint get -inf on every token their
   grammar forbids (in place; runner.structured computed the masks). Everything below,
   logprobs included, sees the constrained distribution; other rows are untouched.
1. Raw log-probabilities: log_softmax of the unmodified logits, for rows that asked for
   logprobs (the sampled token's logprob and the top-k alternatives are read from these).
2. Fast path: when every row is greedy with no penalties, no active min_tokens and no
   logprobs, return the argmax of the raw logits.
3. min_tokens: while a row's output is shorter than min_tokens, its EOS and stop_token_ids
   get -inf (not on constrained rows: their grammar decides where the output may end).
4. Penalties: repetition penalty over prompt+output tokens (positive logits divided, negative
   multiplied), then frequency (per occurrence) and presence (once) penalties over output
   tokens, subtracted.
5. Greedy rows (temperature 0): argmax of the penalized logits.
6. Other rows: divide by temperature; top_k; top_p (nucleus); softmax; min_p (relative to the
   most likely token) and renormalise; draw one token (the inverse of the row's CDF at one
   uniform draw). Rows with no filter (the OpenAI default) take all of step 6 in one compiled
   pass (`_native_draw`, csrc/sampling.cpp) where the kernels are built: softmax(logits /
   temperature), the same distribution. Rows with a seed draw their uniform from their own
   torch.Generator (created at first sight, kept across steps and preemption, dropped by
   `forget`), so a seed gives the same tokens whatever the batch mates; unseeded rows draw
   together from torch's global generator.

Speculative verification (runner.spec_decode.verify) needs the distributions without the draw:
`target_distributions` runs steps 3-6 through the same two functions as `sample`
(`_penalize` for steps 3-4, `_probabilities` for step 6), so the two cannot drift apart. A
change to what a row samples from belongs in one of those two.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from modelyard.engine.core.scheduler_output import ScheduledRequest
from modelyard.engine.messages import TokenLogprobs
from modelyard.engine.sampling_params import SamplingParams
from modelyard.runner import kernels
from modelyard.runner.structured.masks import TokenMasks, apply_masks


class Sampler:
    """Samples one token per row; keeps the per-request seeded generators."""

    def __init__(self, eos_token_ids: Sequence[int]) -> None:
        self._eos_token_ids = list(eos_token_ids)  # masked while output < min_tokens
        self._generators: dict[str, torch.Generator] = {}  # request id -> seeded generator

    def forget(self, request_ids: Iterable[str]) -> None:
        """Drop the state of finished or aborted requests."""
        for rid in request_ids:
            self._generators.pop(rid, None)

    def sample(
        self,
        logits: torch.Tensor,
        requests: Sequence[ScheduledRequest],
        masks: TokenMasks | None = None,
    ) -> tuple[list[int], list[TokenLogprobs | None]]:
        """logits: (B, V), row i for requests[i]. Returns (token ids, logprobs or None) per row.
        `masks` (step 0): the constrained rows' allowed tokens, applied in place first."""
        if masks is not None:
            apply_masks(logits, masks)
        if all(_is_plain_greedy(r) for r in requests):
            # in the model's dtype: widening bf16 to float32 is exact, so the argmax is the same
            # (and a (32, 49152) float32 copy per decode step is saved)
            return _argmax(logits).tolist(), [None] * len(requests)
        # a copy only where min_tokens or penalties modify the logits in place below
        logits = logits.to(torch.float32, copy=any(self._modifies(r) for r in requests))
        params = [r.sampling_params for r in requests]
        raw_logprobs = _raw_logprobs(logits, params)
        self._penalize(logits, requests)
        tokens = self._choose(logits, requests)
        return tokens, _collect_logprobs(raw_logprobs, params, tokens)

    def target_distributions(
        self, logits: torch.Tensor, requests: Sequence[ScheduledRequest]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Steps 3-6 without the draw, for verifying proposed tokens: logits (B, V) ->
        (argmax of the penalized logits (B,) — the greedy rows' tokens, probabilities (B, V)
        or None when every row is greedy). A sampling row's probabilities are exactly the
        distribution `sample` draws that row's token from, normalised to sum 1 (NaN where the
        logits are, all -inf included); greedy rows are 0. Row i's output_token_ids must hold
        the tokens before its position."""
        if all(_is_plain_greedy(r) for r in requests):
            return _argmax(logits), None
        logits = logits.to(torch.float32, copy=True)
        self._penalize(logits, requests)
        tokens = _argmax(logits)
        rows = [i for i, r in enumerate(requests) if not r.sampling_params.greedy]
        if not rows:
            return tokens, None
        probs = torch.zeros_like(logits)  # greedy rows stay 0: their token is the argmax
        index = torch.tensor(rows, dtype=torch.long)
        probs[index] = _probabilities(logits[index], [requests[i].sampling_params for i in rows])
        return tokens, probs

    def generator(self, request: ScheduledRequest) -> torch.Generator | None:
        """The request's seeded generator (None: torch's global one)."""
        seed = request.sampling_params.seed
        return None if seed is None else self._generator(request.request_id, seed)

    @staticmethod
    def _modifies(req: ScheduledRequest) -> bool:
        p = req.sampling_params
        return _has_penalties(p) or len(req.output_token_ids) < p.min_tokens

    def _penalize(self, logits: torch.Tensor, requests: Sequence[ScheduledRequest]) -> None:
        """Steps 3-4 in place on float32 (B, V) logits: min_tokens, then the penalties."""
        self._apply_min_tokens(logits, requests)
        _apply_penalties(logits, requests)

    def _apply_min_tokens(self, logits: torch.Tensor, requests: Sequence[ScheduledRequest]) -> None:
        rows: list[int] = []
        banned: list[int] = []
        for i, req in enumerate(requests):
            p = req.sampling_params
            if len(req.output_token_ids) < p.min_tokens and p.constraint is None:
                ids = [*self._eos_token_ids, *p.stop_token_ids]
                rows += [i] * len(ids)
                banned += ids
        if rows:  # one indexed write for the batch
            logits[torch.tensor(rows), torch.tensor(banned, dtype=torch.long)] = float("-inf")

    def _choose(self, logits: torch.Tensor, requests: Sequence[ScheduledRequest]) -> list[int]:
        rows = [i for i, r in enumerate(requests) if not r.sampling_params.greedy]
        if len(rows) == len(requests):  # every row draws: no argmax, no copy of the rows
            return list(self._draw_rows(logits, requests).tolist())
        tokens = _argmax(logits)  # (B,) — right for greedy rows, overwritten for others
        if rows:
            row_idx = torch.tensor(rows, dtype=torch.long)
            tokens[row_idx] = self._draw_rows(logits[row_idx], [requests[i] for i in rows])
        return list(tokens.tolist())

    def _draw_rows(
        self, logits: torch.Tensor, requests: Sequence[ScheduledRequest]
    ) -> torch.Tensor:
        """One token per row of (R, V) penalized logits, every row sampling: rows with no
        top-k / top-p / min-p filter in one pass of the compiled kernel where it is built (the
        same distribution and draw rule as the torch path, ~1 ms instead of ~5-9 ms over
        (32, 49152)), else temperature, filters, softmax and `_draw`."""
        params = [r.sampling_params for r in requests]
        uniform = self._uniforms(requests)
        if all(_unfiltered(p) for p in params) and kernels.loaded() and logits.is_contiguous():
            inv_t = torch.tensor([1.0 / p.temperature for p in params], dtype=torch.float32)
            return _native_draw(logits, inv_t, uniform.to(torch.float64))
        return _draw(_probabilities(logits, params), uniform)

    def _uniforms(self, requests: Sequence[ScheduledRequest]) -> torch.Tensor:
        """One uniform draw per request: unseeded ones together from torch's global generator,
        seeded ones from their own."""
        uniform = torch.rand(len(requests))
        for j, req in enumerate(requests):
            if req.sampling_params.seed is not None:
                gen = self._generator(req.request_id, req.sampling_params.seed)
                uniform[j] = torch.rand(1, generator=gen)[0]
        return uniform

    def _generator(self, request_id: str, seed: int) -> torch.Generator:
        gen = self._generators.get(request_id)
        if gen is None:
            gen = torch.Generator()
            gen.manual_seed(seed)
            self._generators[request_id] = gen
        return gen


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """(B, V) float32 or bfloat16 -> (B,) argmax: the compiled kernel when built (same result as
    torch's, the first maximum; docs/benchmarks.md has its speed), else torch."""
    if kernels.loaded() and logits.is_contiguous() and logits.numel():
        return kernels.argmax_rows(logits)
    return logits.argmax(dim=-1)


def _draw(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One token per row of (R, V) probabilities, by inverting each row's cumulative sum at its
    uniform draw (R,) in [0, 1): the first token whose cumulative sum exceeds u x the row's total,
    never one of probability 0. torch.multinomial's sampler took ~90 ms over (32, 49152) rows
    on a 2-core host, this ~1 ms."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1]
    below = torch.nextafter(total, torch.zeros_like(total))  # u x total stays under the total
    target = torch.minimum(uniform.to(cdf.dtype) * total, below)
    return torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)


def draw_one(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from (V,) probabilities with a positive total (not necessarily 1), by the rule
    `sample` draws with, at one uniform draw from `generator` (None: torch's global one)."""
    return int(_draw(probs.unsqueeze(0), torch.rand(1, generator=generator))[0])


def _native_draw(logits: torch.Tensor, inv_t: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """csrc/sampling.cpp: one token per row of logits (R, V) float32 or bfloat16 contiguous,
    drawn from softmax(logits x inv_t (R,) float32) by inverting the row's CDF at uniform (R,)
    float64 in [0, 1); tokens more than 87 (scaled) below the row's maximum, -inf included, are
    never drawn. -> (R,) int64."""
    out: torch.Tensor = torch.ops.modelyard_kernels.sample_rows(logits, inv_t, uniform)
    return out


def _has_penalties(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _unfiltered(p: SamplingParams) -> bool:
    """No filter of `_probabilities` applies (the compiled draw skips them): it must name
    every one, or plain sampling and verification part ways."""
    return p.top_k <= 0 and p.top_p >= 1.0 and p.min_p <= 0.0


def _is_plain_greedy(req: ScheduledRequest) -> bool:
    p = req.sampling_params
    return (
        p.greedy
        and not _has_penalties(p)
        and len(req.output_token_ids) >= p.min_tokens
        and p.logprobs is None
    )


def _raw_logprobs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor | None:
    """(B, V) log_softmax of the raw logits, or None when no row asked for logprobs."""
    if all(p.logprobs is None for p in params):
        return None
    return torch.log_softmax(logits, dim=-1)


def _collect_logprobs(
    raw: torch.Tensor | None, params: Sequence[SamplingParams], tokens: Sequence[int]
) -> list[TokenLogprobs | None]:
    out: list[TokenLogprobs | None] = []
    for i, p in enumerate(params):
        if raw is None or p.logprobs is None:
            out.append(None)
            continue
        row = raw[i]
        top_vals, top_ids = torch.topk(row, p.logprobs) if p.logprobs else (row[:0], row[:0])
        finite = top_vals > float("-inf")  # a grammar's forbidden tokens are not alternatives
        top_vals, top_ids = top_vals[finite], top_ids[finite]
        out.append(
            TokenLogprobs(
                token_id=int(tokens[i]),
                logprob=float(row[tokens[i]]),
                top_token_ids=[int(t) for t in top_ids.tolist()],
                top_logprobs=[float(v) for v in top_vals.tolist()],
            )
        )
    return out


def _apply_penalties(logits: torch.Tensor, requests: Sequence[ScheduledRequest]) -> None:
    """In place on (B, V) logits, for the rows that set a penalty."""
    vocab = logits.shape[1]
    for i, req in enumerate(requests):
        p = req.sampling_params
        if not _has_penalties(p):
            continue
        output = torch.tensor(list(req.output_token_ids), dtype=torch.long)
        output = output[output < vocab]
        row = logits[i]
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(list(req.prompt_token_ids), dtype=torch.long)
            seen = torch.unique(torch.cat([seen[seen < vocab], output]))
            vals = row[seen]
            row[seen] = torch.where(
                vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty
            )
        if output.numel() and (p.frequency_penalty or p.presence_penalty):
            counts = torch.bincount(output, minlength=vocab).to(row.dtype)  # (V,)
            row -= counts * p.frequency_penalty + (counts > 0).to(row.dtype) * p.presence_penalty


def _probabilities(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """(R, V) penalized logits of the non-greedy rows -> (R, V) probabilities each row samples
    from (step 6 without the draw): temperature, top_k, top_p, softmax, min_p, each row
    renormalised to sum 1."""
    if any(p.temperature != 1.0 for p in params):
        temps = torch.tensor([p.temperature for p in params], dtype=logits.dtype)
        logits = logits / temps.unsqueeze(1)
    top_k = [p.top_k if p.top_k > 0 else 0 for p in params]
    top_p = [p.top_p for p in params]
    if any(top_k) or any(tp < 1.0 for tp in top_p):
        logits = _top_k_top_p(logits, top_k, top_p)
    probs = torch.softmax(logits, dim=-1)
    min_p = torch.tensor([p.min_p for p in params], dtype=probs.dtype)
    if bool((min_p > 0).any()):
        threshold = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(1)  # (R, 1)
        probs = probs.masked_fill(probs < threshold, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)  # the most likely token is always kept
    return probs


def _top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Mask (R, V) logits outside each row's top_k / nucleus top_p with -inf."""
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=False)  # ascending
    k = torch.tensor([kk if kk > 0 else vocab for kk in top_k], dtype=torch.long).clamp(max=vocab)
    kth = sorted_logits.gather(1, (vocab - k).unsqueeze(1))  # (R, 1) smallest kept logit
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    p = torch.tensor(top_p, dtype=logits.dtype)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # ascending
    drop = cumulative <= (1.0 - p).unsqueeze(1)
    drop[:, -1] = False  # always keep the most likely token
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
