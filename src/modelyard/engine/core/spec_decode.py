"""Speculative decoding: which requests speculate each step, and what it earned.

A cheap proposer guesses the next k tokens of a request; the target model checks all of them in
one forward of the normal batched step, so a step can yield up to k + 1 tokens for the price of
about one. The pieces:

- the scheduler asks `SpecDecodePolicy.num_spec_tokens` for each running decode and reserves
  that many extra KV slots after its last token (`ScheduledRequest.num_spec_tokens`), inside the
  step's token budget; slots are only taken when the free list has them (speculation never
  preempts anyone);
- the runner fills those slots with proposed tokens (runner.spec_decode: prompt-lookup n-grams,
  a draft model, or the target's own first layers), runs the target over
  [last token, d1..dj] (j <= k), and verifies: greedy requests keep the drafts while they equal
  the target's argmax, sampled ones follow the rejection-sampling rule (the output distribution
  stays the target's). It returns the accepted drafts plus one more token from the target
  (the correction at the first rejected position, or the bonus after the last accepted one);
- `Scheduler.update` rolls the request back past the rejected slots (their KV is never read:
  attention only reads positions below a query's own, and the blocks holding only rejected
  slots go back to the free list), appends the accepted tokens and the target's token one by one
  through the usual stop checks (a stop token inside an accepted run ends the request there),
  and counts the result in `SpecDecodeStats`.

Policy, per request and step (the textbook's rule as the default):
1. the model has a speculative config (`draft_enabled`), and the request is a decode (its
   prefill is done) that asks for no logprobs (a request with an output constraint
   speculates too: its verification rows are masked by its grammar, runner.structured);
2. `SamplingParams.speculate`: False never speculates; True always does; None (the default)
   speculates when max_tokens is None or >= `long_output_tokens` (long outputs only), unless
   the request samples with a seed: a seed promises the same tokens whatever the batch mates,
   and whether a step speculates depends on them (rule 3), which changes how the request's
   random numbers are used;
3. the step starts with at most `disable_by_batch_size` running requests: past that a batched
   decode step is compute-bound on CPU and verifying k extra rows per request costs more than
   the accepted tokens save, so nobody speculates in that step;
4. k is capped so the request can neither pass max_tokens nor the context length;
5. with `adaptive` (the default) k is the request's own: num_speculative_tokens until its
   first verified draft, then the k in [1, num_speculative_tokens] that yields the most tokens
   per unit of step time, given the request's acceptance rate a (each verified draft token is
   a trial, accepted or the one rejected; earlier ones weigh 0.8 at each draft): a step yields
   (1 - a^(k+1)) / (1 - a) tokens and costs 1 + ROW_COST x k. Every proposed token is a row
   of the target's step (a 9-row step takes ~1.2x a 1-row one on CPU), so a request whose
   drafts fail (random text: a ~0) verifies one extra row instead of k, and one whose drafts
   hold (a ~0.75 when quoting the prompt) keeps k.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from modelyard.engine.config import SpeculativeConfig
from modelyard.engine.core.kv_cache import KVCacheManager
from modelyard.engine.core.request import Request
from modelyard.engine.core.scheduler_output import DraftResult, ScheduledRequest
from modelyard.engine.messages import SchedulerStats

ROW_COST = 0.025
"""A verified row's cost as a share of a one-row decode step (rule 5): a step of 1 + 8 rows
took ~1.2x a one-row step for the default model in float32 and bfloat16 on CPU."""

TRIAL_DECAY = 0.8
"""Rule 5: the weight of a request's earlier trials at each new draft."""


def best_k(acceptance: float, k_max: int) -> int:
    """Rule 5: the draft length in [1, k_max] with the most expected tokens per step time."""
    if acceptance >= 1.0:
        return k_max

    def value(k: int) -> float:
        return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance) / (1.0 + ROW_COST * k)

    return max(range(1, k_max + 1), key=value)


class SpecDecodePolicy:
    """How many speculative slots each decode gets this step (see the module docstring)."""

    def __init__(self, config: SpeculativeConfig | None, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len

    @property
    def enabled(self) -> bool:
        return self.config is not None

    @property
    def method(self) -> str:
        """The proposer ("" when the model does not speculate)."""
        return self.config.method if self.config is not None else ""

    def step_allows(self, num_running: int) -> bool:
        """Rule 3: False when the step starts with too many running requests."""
        return self.config is not None and num_running <= self.config.disable_by_batch_size

    def reserve(self, request: Request, kv_cache: KVCacheManager, token_budget: int) -> int:
        """Slots for a decode (rules 1, 2, 4, and the step's token budget), allocated now if
        the free list has them; 0 otherwise (never by preemption)."""
        num_spec = min(self.num_spec_tokens(request), token_budget - 1)
        if num_spec > 0 and kv_cache.allocate_slots(request, 1 + num_spec):
            return num_spec
        return 0

    def num_spec_tokens(self, request: Request) -> int:
        """Rules 1, 2 and 4 for one request whose next step is a plain decode."""
        config = self.config
        params = request.sampling_params
        if config is None or params.speculate is False or params.logprobs is not None:
            return 0
        if params.speculate is None:
            long_output = (
                params.max_tokens is None or params.max_tokens >= config.long_output_tokens
            )
            if not long_output or (params.seed is not None and not params.greedy):
                return 0
        k = config.num_speculative_tokens
        if request.spec_k is not None:  # rule 5 (set only when adaptive)
            k = request.spec_k
        if params.max_tokens is not None:  # the target's own token comes on top of the drafts
            k = min(k, params.max_tokens - request.num_output_tokens - 1)
        k = min(k, self.max_model_len - request.num_tokens - 1)
        return max(k, 0)

    def adapt(self, request: Request, draft: DraftResult | None) -> None:
        """Rule 5: the request's next k from how much of this draft the target accepted (no
        draft: the proposer had nothing, k stays)."""
        config = self.config
        if config is None or not config.adaptive or draft is None or not draft.draft_token_ids:
            return
        proposed, accepted = len(draft.draft_token_ids), draft.num_accepted
        trials = accepted + (1 if accepted < proposed else 0)  # the run and its rejected token
        old_accepted, old_trials = request.spec_trials
        request.spec_trials = (
            old_accepted * TRIAL_DECAY + accepted,
            old_trials * TRIAL_DECAY + trials,
        )
        rate = request.spec_trials[0] / request.spec_trials[1]
        request.spec_k = best_k(rate, config.num_speculative_tokens)


@dataclass
class SpecDecodeStats:
    """Cumulative counts since the engine started (vLLM's spec_decode metrics)."""

    method: str = ""  # the proposer: ngram, draft or self_draft ("" when disabled)
    num_drafts: int = 0  # verification runs with at least one proposed token
    num_draft_tokens: int = 0  # tokens proposed
    num_accepted_tokens: int = 0  # proposed tokens the target accepted
    accepted_per_pos: list[int] = field(default_factory=list)  # accepted at draft position i

    def settle(
        self,
        request: Request,
        entry: ScheduledRequest,
        draft: DraftResult | None,
        kv_cache: KVCacheManager,
    ) -> list[int]:
        """After a step: roll the request back past its rejected slots (blocks holding only
        those go back to the free list), count the result; the accepted drafts."""
        accepted = draft.accepted_token_ids if draft is not None else []
        request.num_computed_tokens -= entry.num_spec_tokens - len(accepted)
        kv_cache.trim(request, request.num_computed_tokens)
        if draft is not None:
            self.observe(len(draft.draft_token_ids), len(accepted))
        return accepted

    def fill(self, stats: SchedulerStats) -> None:
        """Copy the counts into the scheduler's stats (its spec_decode_* fields)."""
        stats.spec_decode_method = self.method
        stats.spec_decode_num_drafts = self.num_drafts
        stats.spec_decode_num_draft_tokens = self.num_draft_tokens
        stats.spec_decode_num_accepted_tokens = self.num_accepted_tokens
        stats.spec_decode_num_accepted_tokens_per_pos = list(self.accepted_per_pos)

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_pos) < num_accepted:
            self.accepted_per_pos.extend([0] * (num_accepted - len(self.accepted_per_pos)))
        for position in range(num_accepted):
            self.accepted_per_pos[position] += 1
