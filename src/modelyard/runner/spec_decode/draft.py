"""Draft-model proposals: a smaller Llama-family model guesses the next k tokens greedily.

The draft is either a second model that shares the target's tokenizer (its own weights and KV
tensors) or a self-draft: the target's own first N layers, its final norm and its head, sharing
the target's weights and the KV cache of those layers.

The draft's KV cache uses the target's block tables (its tensors have the same number of
blocks), so it needs no allocator of its own: the scheduler has reserved slots up to the last
speculative position, and the draft writes KV only below that. Per request and step:

1. catch up: run the draft over the request's tokens it has not seen, up to and including the
   last one (a separate draft sees the whole prompt on its first proposal; a self-draft's layers
   already hold the target's KV for every earlier position, so it runs only the last token);
   argmax of the last row is d1;
2. k - 1 more single-token forwards, all requests batched: d_i in, d_{i+1} out;
3. after verification, `verified` keeps the draft's progress only over the accepted tokens
   (its KV at rejected positions is for tokens that are not the request's).

A self-draft writes its layers' KV at the speculative positions before the target's verifying
forward writes the same layers there again (for the same tokens): the target's own values win.
A preempted request's blocks are gone, so `forget` resets its progress. Drafts run on the base
weights: a request's LoRA adapter applies to the target's verifying forward only.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Sequence

import torch

from modelyard.engine.core.scheduler_output import ScheduledRequest
from modelyard.runner import kernels
from modelyard.runner.attention import AttentionMetadata
from modelyard.runner.models.decoder import DecoderModel


def self_draft_model(target: DecoderModel, num_layers: int) -> DecoderModel:
    """A view of the target that runs only its first `num_layers` layers (then the target's
    final norm and head), sharing its weights and those layers' KV cache."""
    if not 1 <= num_layers < len(target.layers):
        raise ValueError(f"draft_layers must be in [1, {len(target.layers) - 1}]: {num_layers}")
    view = copy.copy(target)
    view.layers = target.layers[:num_layers]
    view.k_cache = target.k_cache[:num_layers]
    view.v_cache = target.v_cache[:num_layers]
    view.loop = view.decode_loop() if view.fused else None  # the target's runs every layer
    return view


class DraftProposer:
    """Greedy proposals from a draft DecoderModel (see the module docstring)."""

    def __init__(
        self, model: DecoderModel, *, block_size: int, shares_target_cache: bool, team: bool
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.shares_target_cache = shares_target_cache  # a self-draft
        self.team = team  # decode-only draft forwards run with kernels.team
        self._computed: dict[str, int] = {}  # request id -> positions with valid draft KV

    def propose(self, requests: Sequence[ScheduledRequest]) -> dict[str, list[int]]:
        if not requests:
            return {}
        first = self._catch_up(requests)  # (R,) d1 of each request
        drafts = {r.request_id: [t] for r, t in zip(requests, first, strict=True)}
        for step in range(1, max(r.num_spec_tokens for r in requests)):
            live = [r for r in requests if r.num_spec_tokens > step]
            tokens = [drafts[r.request_id][-1] for r in live]
            positions = [r.start_position + step for r in live]
            nxt = self._forward(live, positions, [[t] for t in tokens])
            for r, t in zip(live, nxt, strict=True):
                drafts[r.request_id].append(t)
        for r in requests:
            self._computed[r.request_id] = r.start_position + r.num_spec_tokens
        return drafts

    def verified(self, request: ScheduledRequest, num_accepted: int) -> None:
        """Keep the draft's KV only up to the last accepted token."""
        rid = request.request_id
        if rid in self._computed:
            accepted_end = request.start_position + 1 + num_accepted
            self._computed[rid] = min(self._computed[rid], accepted_end)

    def forget(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self._computed.pop(rid, None)

    def _catch_up(self, requests: Sequence[ScheduledRequest]) -> list[int]:
        """Run each request's unseen tokens through its last one; the argmax after it."""
        starts, chunks = [], []
        for r in requests:
            last = r.start_position  # the position of token_ids[0], the request's last token
            done = (
                last if self.shares_target_cache else min(self._computed.get(r.request_id, 0), last)
            )
            tokens = itertools.chain(r.prompt_token_ids, r.output_token_ids)
            chunks.append(list(itertools.islice(tokens, done, last + 1)))
            starts.append(done)
        return self._forward(requests, starts, chunks)

    def _forward(
        self, requests: Sequence[ScheduledRequest], starts: list[int], chunks: list[list[int]]
    ) -> list[int]:
        """One draft forward over each request's chunk from its start; argmax of each last row."""
        lengths = [len(c) for c in chunks]
        meta = AttentionMetadata.build(
            starts,
            lengths,
            [r.block_table for r in requests],
            self.block_size,
            self.model.sliding_window,
        )
        input_ids = torch.tensor([t for c in chunks for t in c], dtype=torch.long)  # (T,)
        last_rows = torch.tensor(list(itertools.accumulate(lengths)), dtype=torch.long) - 1
        with kernels.team(meta.all_decodes and self.team):
            logits = self.model.forward(input_ids, meta, last_rows)  # (R, V)
        return [int(t) for t in logits.argmax(dim=-1).tolist()]
