"""Prompt-lookup proposals: continue the text where its last few tokens occurred before.

For a request's tokens t (prompt + output), try n = prompt_lookup_max down to
prompt_lookup_min: find the earlier occurrences of the suffix t[-n:] (not the suffix itself)
and propose the up to k tokens that followed the FIRST one. The longest n wins; among equal n
the earliest occurrence, as vLLM's n-gram proposer does: on input-grounded work (quoting or
editing a passage) that is usually the source text in the prompt, where later occurrences are
often the output's own earlier copy. No model runs; a miss proposes nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from modelyard.engine.core.scheduler_output import ScheduledRequest


def lookup(tokens: npt.NDArray[np.int64], min_n: int, max_n: int, k: int) -> list[int]:
    """tokens (L,) int64 -> up to k tokens that followed the longest earlier match of a suffix
    n-gram (n in [min_n, max_n]); [] when none matches."""
    length = tokens.shape[0]
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        # windows starting at i < length - n: each has a token after it, and the suffix itself
        # (i = length - n) is excluded
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)  # (length - n, n)
        hits = np.flatnonzero((windows == tokens[length - n :]).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return [int(t) for t in tokens[start : start + k]]
    return []


class NgramProposer:
    """Proposes by prompt lookup (see the module docstring); keeps no state."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, requests: Sequence[ScheduledRequest]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for req in requests:
            tokens = np.fromiter(
                itertools.chain(req.prompt_token_ids, req.output_token_ids), dtype=np.int64
            )
            draft = lookup(tokens, self.min_n, self.max_n, req.num_spec_tokens)
            if draft:
                out[req.request_id] = draft
        return out

    def verified(self, request: ScheduledRequest, num_accepted: int) -> None:
        """Nothing to track."""

    def forget(self, request_ids: Iterable[str]) -> None:
        """Nothing to drop."""
