"""The matchers of the constrained requests and the token masks of each step.

Everything here runs in the engine worker process. Per step (`ModelRunner.execute`):

1. `start(requests)`, before the forward: a worker thread brings each constrained request's
   matcher up to date with its output tokens — the tokens accepted since the last step are
   consumed; when the output is shorter than what the matcher consumed (a preemption that
   dropped tokens, a failed step re-run), the matcher rolls back (or is rebuilt from the
   compiled grammar and replays the output) — then fills one bitmask row per constrained row;
   the forward runs meanwhile (llguidance drops the GIL while computing a mask);
2. `PendingMasks.result()` after the forward: the `TokenMasks` the sampler applies, and those
   of the rows that verify drafts (speculative decoding: row p of a request is masked as if
   its first p draft tokens were accepted, so verification accepts only grammatical drafts
   and draws corrections from the constrained distribution).

Matchers are keyed by request id (one per engine request, so one per `n` sample) and created
on first sight from the grammar cache; `forget` drops those of finished requests. A token the
grammar rejects (never sampled through a mask) raises ConstraintError, which fails that request
alone (engine/core/isolation.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import llguidance
import torch

from modelyard.engine.constraints import ConstraintError
from modelyard.engine.core.scheduler_output import ScheduledRequest, StructuredOutputStats
from modelyard.runner.structured.grammars import DEFAULT_CAPACITY, GrammarCache
from modelyard.runner.structured.masks import TokenMasks

TokenizerLoader = Callable[[], llguidance.LLTokenizer]
Drafted = tuple[ScheduledRequest, Sequence[int]]  # a request with drafts, and its drafts


@dataclass(slots=True)
class _Matcher:
    matcher: llguidance.LLMatcher
    consumed: int = 0  # output tokens the matcher has consumed


@dataclass(slots=True)
class StepMasks:
    """The masks of one step: for the plainly sampled rows, and for the verified draft rows."""

    plain: TokenMasks | None = None
    """Rows index the step's plainly sampled requests (None: none is constrained)."""
    drafts: TokenMasks | None = None
    """Rows index the verification rows of the requests with drafts: per request, in order,
    one row per draft token plus one (None: none is constrained)."""


@dataclass(slots=True)
class PendingMasks:
    """The masks of one step, being computed by the worker thread."""

    _future: Future[StepMasks] | None = field(default=None)

    def result(self) -> StepMasks:
        """The step's masks; re-raises the thread's error."""
        return StepMasks() if self._future is None else self._future.result()


class StructuredOutputs:
    """Matchers per request, the grammar cache, and a one-thread pool for the masks."""

    def __init__(self, load_tokenizer: TokenizerLoader, capacity: int = DEFAULT_CAPACITY) -> None:
        """`load_tokenizer` is called once, at the first constrained request (building the
        llguidance tokenizer of a 49k vocabulary takes ~0.5 s)."""
        self._load_tokenizer = load_tokenizer
        self._capacity = capacity
        self._grammars: GrammarCache | None = None
        self._matchers: dict[str, _Matcher] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._words = 0  # 32-bit words per bitmask row
        self.stats = StructuredOutputStats()

    def forget(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self._matchers.pop(rid, None)

    def start(
        self, requests: Sequence[ScheduledRequest], drafted: Sequence[Drafted] = ()
    ) -> PendingMasks:
        """Start computing the masks of `requests` (the step's plainly sampled rows, in order)
        and of `drafted` (the requests with drafts and their drafts, in verification order)."""
        rows = [i for i, r in enumerate(requests) if r.sampling_params.constraint is not None]
        if not rows and all(r.sampling_params.constraint is None for r, _ in drafted):
            return PendingMasks()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-masks")
        return PendingMasks(self._pool.submit(self._step_masks, rows, requests, drafted))

    def _step_masks(
        self, rows: list[int], requests: Sequence[ScheduledRequest], drafted: Sequence[Drafted]
    ) -> StepMasks:
        plain = self.masks(rows, [requests[i] for i in rows]) if rows else None
        return StepMasks(plain, self.draft_masks(drafted))

    def draft_masks(self, drafted: Sequence[Drafted]) -> TokenMasks | None:
        """The masks of the verification rows of `drafted`: row p of a request is the mask
        after its output and draft[:p]. Rows past a draft token the grammar rejects allow
        everything (verification never reaches them: that token has probability 0). The
        matchers end where they started."""
        rows: list[int] = []
        filled: list[torch.Tensor] = []
        first = 0
        for req, draft in drafted:
            if req.sampling_params.constraint is not None:
                started = time.perf_counter()
                filled.append(self._draft_rows(req, draft))
                rows += range(first, first + len(draft) + 1)
                self.stats.mask_seconds += time.perf_counter() - started
            first += len(draft) + 1
        return TokenMasks(rows=rows, bitmask=torch.cat(filled)) if rows else None

    def masks(self, rows: list[int], requests: Sequence[ScheduledRequest]) -> TokenMasks:
        """Synchronous step 1: update the matchers of `requests` and fill their rows."""
        started = time.perf_counter()
        grammars = self._grammar_cache()
        bitmask = torch.zeros(len(requests), self._words, dtype=torch.int32)  # (R, W)
        for j, req in enumerate(requests):
            matcher = self._synced(grammars, req)
            row = bitmask[j]
            matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
        self.stats.compile_seconds = grammars.compile_seconds
        self.stats.mask_seconds += time.perf_counter() - started
        self.stats.mask_steps += 1
        return TokenMasks(rows=rows, bitmask=bitmask)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _draft_rows(self, req: ScheduledRequest, draft: Sequence[int]) -> torch.Tensor:
        """(len(draft) + 1, W) masks of one request's verification rows."""
        matcher = self._synced(self._grammar_cache(), req)
        bitmask = torch.full((len(draft) + 1, self._words), -1, dtype=torch.int32)
        valid = matcher.validate_tokens(list(draft))  # the draft's grammatical prefix
        for p in range(valid + 1):
            row = bitmask[p]
            matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
            if p < valid:
                matcher.consume_token(draft[p])
        if valid and not matcher.rollback(valid):
            del self._matchers[req.request_id]  # rebuilt from the output at the next sync
        return bitmask

    def _grammar_cache(self) -> GrammarCache:
        if self._grammars is None:
            tokenizer = self._load_tokenizer()
            self._grammars = GrammarCache(tokenizer, self._capacity)
            self._words = (tokenizer.vocab_size + 31) // 32
        return self._grammars

    def _synced(self, grammars: GrammarCache, req: ScheduledRequest) -> llguidance.LLMatcher:
        """The request's matcher, having consumed exactly its output tokens."""
        constraint = req.sampling_params.constraint
        assert constraint is not None  # start() picks constrained rows only
        state = self._matchers.get(req.request_id)
        if state is None:
            state = _Matcher(grammars.matcher(constraint))
            self._matchers[req.request_id] = state
            self.stats.constrained_requests += 1
        output = req.output_token_ids
        if len(output) < state.consumed:  # the output got shorter: roll back, else rebuild
            if state.matcher.rollback(state.consumed - len(output)):
                state.consumed = len(output)
            else:
                state.matcher, state.consumed = grammars.matcher(constraint), 0
        new = list(output[state.consumed :])
        if new and not state.matcher.consume_tokens(new):
            del self._matchers[req.request_id]
            raise ConstraintError(f"request {req.request_id}: {state.matcher.get_error()[:300]}")
        state.consumed = len(output)
        return state.matcher


def hf_tokenizer_loader(path: str, vocab_size: int, eos_token_ids: list[int]) -> TokenizerLoader:
    """A loader of the llguidance tokenizer of the HF tokenizer in `path`, for a model whose
    logits have `vocab_size` columns and whose generation ends with `eos_token_ids`."""

    def load() -> llguidance.LLTokenizer:
        import llguidance.hf
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(path)
        eos = eos_token_ids or None
        return llguidance.hf.from_tokenizer(hf, n_vocab=vocab_size, eos_token=eos)  # type: ignore[arg-type]

    return load
