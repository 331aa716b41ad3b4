"""The scheduler: which requests run each step, and how many tokens each.

Pure CPU code behind two methods (vLLM v1 / nano-vllm shape):

- `schedule() -> SchedulerOutput` builds one mixed batch (iteration-level continuous batching):
  1. RUNNING requests continue, best first (priority desc, arrival asc): a decode takes one
     token, an unfinished prefill takes its next chunk. When the KV cache has no block for one,
     the worst running request (lowest priority, latest arrival; possibly itself) is preempted
     by recompute: its blocks are freed, its outputs kept, and it goes back to the front of its
     priority class in the waiting queue with num_computed_tokens = 0.
  2. Unless step 1 preempted something, WAITING requests join in (priority desc, arrival asc)
     order while the token budget (`max_num_batched_tokens`) and `max_num_seqs` allow. Their
     leading full blocks come from the prefix cache; a prompt longer than the remaining budget
     is chunked over several steps (`sample=False` until its last chunk). The queue is strict:
     when its head cannot get blocks, nobody behind it is admitted this step — except that a
     head with a STRICTLY higher priority than the worst running request preempts that request
     (repeatedly, worst first) to make room. Equal priorities never preempt each other on
     admission, so FCFS inside a class cannot thrash.
  A request with a LoRA adapter is admitted only while the running requests use fewer than
  `max_loras` different adapters (or already use its own); its prefix-cache hashes are salted
  with the adapter, so adapters never share KV.
- `update(scheduler_output, runner_output) -> list[EngineOutput]` appends the sampled tokens,
  applies the stop checks and frees the blocks of finished requests at once (their ids go to
  the runner with the next batch).

Speculative decoding (engine.core.spec_decode) stays inside this shape: in step 1 a decode may get
`num_spec_tokens` extra slots (if the policy allows and free blocks exist; never by
preemption), counted in the token budget; `update` rolls back the rejected slots and appends the
accepted tokens before the target's own, each through the stop checks.

Blocks enter the prefix cache when the tokens that fill them are scheduled (vLLM does the
same), so n > 1 siblings admitted in one step share the prompt's blocks at once; the runner
writes all new K/V of a step before attention reads the cache. A request preempted after it was
put in the batch, or a batch that fails (`discard`, `fail_requests`), withdraws those entries
again. `fail_requests` settles a batch that failed in part (engine/core/isolation.py): the requests
that made it fail finish as ERROR, those that depended on them are preempted.

The stop checks on each new token are engine.core.step_outputs'.

The context length used here is min(max_model_len, num_blocks * block_size): a request that
could never fit in the whole KV cache would otherwise wait forever.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable

from modelyard.engine.config import CacheConfig, SchedulerConfig
from modelyard.engine.core.kv_cache import KVCacheManager
from modelyard.engine.core.request import Request, RequestStatus
from modelyard.engine.core.scheduler_output import RunnerOutput, SchedulerOutput
from modelyard.engine.core.scheduler_state import StepBatch, WaitingQueue
from modelyard.engine.core.spec_decode import SpecDecodePolicy, SpecDecodeStats
from modelyard.engine.core.step_outputs import append_tokens, error_output
from modelyard.engine.messages import EngineOutput, EngineRequest, SchedulerStats


def _rank(request: Request) -> tuple[int, float, int]:
    """Sort key: best first (higher priority, then earlier arrival)."""
    return (-request.priority, request.arrival_time, request.arrival_order)


class Scheduler:
    """Continuous batching over a paged KV cache with prefix caching and priorities.

    `running` and `waiting` are public for inspection only; change state through the methods.
    """

    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        *,
        num_blocks: int,
        max_model_len: int,
        eos_token_ids: Iterable[int],
        spec_policy: SpecDecodePolicy | None = None,
        max_loras: int = 0,
        vocab_size: int | None = None,
    ) -> None:
        self.config = scheduler_config
        self.kv_cache = KVCacheManager(
            num_blocks, cache_config.block_size, cache_config.enable_prefix_caching
        )
        self.max_model_len = min(max_model_len, num_blocks * cache_config.block_size)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.vocab_size = vocab_size  # prompt and stop token ids are below it (None: unchecked)
        self.requests: dict[str, Request] = {}  # every unfinished request, by id
        self.waiting = WaitingQueue()
        self.running: list[Request] = []  # holds blocks; sorted best first at each schedule
        self.num_preemptions = 0  # cumulative
        self.max_loras = max_loras  # most different LoRA adapters among running requests
        self.spec_policy = spec_policy or SpecDecodePolicy(None, self.max_model_len)
        self.spec_stats = SpecDecodeStats(method=self.spec_policy.method)
        self.num_failed_requests = 0  # cumulative: requests failed by `fail_requests`
        self.num_aborted = 0  # cumulative: live requests aborted (not those already finished)
        self._finished_ids: set[str] = set()  # to hand to the runner with the next batch
        self._preempted_ids: set[str] = set()  # likewise
        self._arrivals = itertools.count()

    # ------------------------------------------------------------------ requests in / out

    def add_request(self, message: EngineRequest) -> None:
        """Queue a request. ValueError for a duplicate id, an empty prompt, a token id outside
        the vocabulary, a prompt longer than max_model_len - 1 (no room for one output token)
        or invalid sampling params."""
        if message.request_id in self.requests:
            raise ValueError(f"request id {message.request_id!r} is already live")
        num_prompt = len(message.prompt_token_ids)
        if num_prompt == 0:
            raise ValueError("prompt must not be empty")
        if num_prompt > self.max_model_len - 1:
            raise ValueError(
                f"prompt has {num_prompt} tokens; at most {self.max_model_len - 1} fit "
                f"(context length {self.max_model_len})"
            )
        message.sampling_params.validate()
        if message.lora is not None and not self.max_loras:
            raise ValueError("this model serves no LoRA adapters")
        token_ids = (*message.prompt_token_ids, *message.sampling_params.stop_token_ids)
        if self.vocab_size is not None and not all(0 <= t < self.vocab_size for t in token_ids):
            raise ValueError(f"a prompt or stop token id is outside [0, {self.vocab_size})")
        request = Request.from_engine_request(message)
        request.arrival_order = next(self._arrivals)
        self.requests[request.request_id] = request
        self.waiting.push(request)

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Finish these requests as ABORTED and free their blocks now; unknown ids are ignored
        (the request may have finished on its own meanwhile). No output is emitted."""
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is not None:
                self.num_aborted += 1
                self._finish(request, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def stats(self) -> SchedulerStats:
        kv = self.kv_cache
        stats = SchedulerStats(
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            num_blocks=kv.num_blocks,
            num_free_blocks=kv.num_free_blocks,
            kv_cache_usage=kv.usage,
            prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
            num_failed_requests=self.num_failed_requests,
            num_aborted=self.num_aborted,
        )
        self.spec_stats.fill(stats)
        return stats

    # ------------------------------------------------------------------ schedule

    def schedule(self) -> SchedulerOutput:
        """Build the next batch (see the module docstring for the policy)."""
        batch = StepBatch(token_budget=self.config.max_num_batched_tokens)
        self._schedule_running(batch)
        if not batch.preempted_ids:
            self._schedule_waiting(batch)
        return self._to_output(batch)

    def _schedule_running(self, batch: StepBatch) -> None:
        self.running.sort(key=_rank)
        speculate = self.spec_policy.step_allows(len(self.running))
        index = 0
        while index < len(self.running) and batch.token_budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, batch.token_budget)
            is_decode = num_new == 1 and request.num_output_tokens > 0
            num_spec = (
                self.spec_policy.reserve(request, self.kv_cache, batch.token_budget)
                if speculate and is_decode
                else 0
            )
            if not num_spec and not self._allocate_or_preempt(request, num_new, batch):
                break  # it preempted itself: it was the last one
            self._add_to_batch(batch, request, num_new, num_spec)
            index += 1

    def _allocate_or_preempt(self, request: Request, num_new: int, batch: StepBatch) -> bool:
        """Get blocks for a running request, preempting the worst running ones (never one
        scheduled earlier in this step: they rank better). False if it preempted itself."""
        while not self.kv_cache.allocate_slots(request, num_new):
            victim = self._worst_running()
            self._preempt(victim, batch)
            if victim is request:
                return False
        return True

    def _schedule_waiting(self, batch: StepBatch) -> None:
        while (
            self.waiting and batch.token_budget > 0 and len(self.running) < self.config.max_num_seqs
        ):
            request = self.waiting.peek()
            if request.request_id in batch.preempted_ids:
                break  # just preempted to make room: do not take it straight back
            if not self._try_admit(request, batch):
                break

    def _try_admit(self, request: Request, batch: StepBatch) -> bool:
        """Admit the head of the queue with its prefix-cache hits, if blocks allow; it may
        preempt running requests of strictly lower priority, worst first (they may already be
        in this batch: they leave it). The lookup is redone after each preemption, since a
        victim's blocks published in this step are withdrawn. A request whose LoRA adapter
        would be one too many among the running ones waits."""
        if not self._lora_fits(request):
            return False
        while True:
            cached_blocks, num_cached = self.kv_cache.get_computed_blocks(request)
            num_new = self._num_prefill_tokens(request.num_tokens - num_cached, batch)
            if num_new == 0:
                return False
            if self.kv_cache.allocate_slots(request, num_new, cached_blocks):
                break
            if not self.running or self._worst_running().priority >= request.priority:
                return False
            self._preempt(self._worst_running(), batch)
        self.waiting.pop()
        self._admit(request, num_cached)
        self._add_to_batch(batch, request, num_new)
        return True

    def _lora_fits(self, request: Request) -> bool:
        if request.lora is None:
            return True
        running = {r.lora for r in self.running if r.lora is not None}
        return request.lora in running or len(running) < self.max_loras

    def _num_prefill_tokens(self, num_uncomputed: int, batch: StepBatch) -> int:
        """Tokens of an admitted prefill to run this step; 0 means it must wait."""
        if num_uncomputed <= batch.token_budget:
            return num_uncomputed
        too_long_to_ever_fit = num_uncomputed > self.config.max_num_batched_tokens
        if self.config.enable_chunked_prefill or too_long_to_ever_fit:
            return batch.token_budget
        return 0

    def _add_to_batch(
        self, batch: StepBatch, request: Request, num_new: int, num_spec: int = 0
    ) -> None:
        """Schedule the tokens and publish the blocks they fill in the prefix cache now, so
        that a request admitted later in this step (n > 1 siblings) already shares them
        (speculative slots hold no known tokens: never published)."""
        batch.add(request, num_new, num_spec)
        self.kv_cache.cache_blocks(request, request.num_computed_tokens + num_new)

    def _worst_running(self) -> Request:
        """The next preemption victim: lowest priority, then latest arrival."""
        return max(self.running, key=_rank)

    def _admit(self, request: Request, num_cached: int) -> None:
        if request.first_scheduled_time is None:
            request.first_scheduled_time = time.time()
            request.num_cached_tokens = num_cached
        request.num_computed_tokens = num_cached
        request.status = RequestStatus.RUNNING
        self.running.append(request)  # ranks after everyone admitted before it this step

    def _preempt(self, request: Request, batch: StepBatch) -> None:
        """Preempt by recompute: free the blocks, keep the outputs, queue it again."""
        if request.request_id in batch.scheduled:  # its KV for this step will not be written
            self.kv_cache.uncache_blocks(request, request.num_computed_tokens)
        self._requeue(request)
        batch.remove(request.request_id)
        batch.preempted_ids.add(request.request_id)

    def _requeue(self, request: Request) -> None:
        """Free a running request's blocks, keep its outputs, queue it again for recompute."""
        self.running.remove(request)
        self.kv_cache.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._preempted_ids.add(request.request_id)
        self.waiting.push(request, front_of_class=True)

    def _to_output(self, batch: StepBatch) -> SchedulerOutput:
        """Decodes first, then prefill chunks; advance num_computed_tokens for all of them."""
        entries = list(batch.scheduled.values())
        scheduled = [e for e in entries if e.request_id in batch.decode_ids]
        scheduled += [e for e in entries if e.request_id not in batch.decode_ids]
        for entry in scheduled:
            request = self.requests[entry.request_id]
            request.num_computed_tokens += len(entry.token_ids) + entry.num_spec_tokens
        finished: set[str] = set()
        preempted: set[str] = set()
        if scheduled:  # an empty batch is not executed: keep the ids for the next one
            finished, self._finished_ids = self._finished_ids, set()
            preempted, self._preempted_ids = self._preempted_ids, set()
        return SchedulerOutput(
            scheduled=scheduled,
            num_batched_tokens=sum(len(e.token_ids) + e.num_spec_tokens for e in scheduled),
            finished_request_ids=finished,
            preempted_request_ids=preempted,
        )

    # ------------------------------------------------------------------ update

    def update(
        self, scheduler_output: SchedulerOutput, runner_output: RunnerOutput
    ) -> list[EngineOutput]:
        """Apply one executed step; one EngineOutput per request that got a token.

        RuntimeError (before changing anything) if the runner skipped a request that had
        sample=True: that is a runner bug, not something to paper over.
        """
        sampled = runner_output.sampled_token_ids
        missing = [
            s.request_id
            for s in scheduler_output.scheduled
            if s.sample and self._is_running(s.request_id) and s.request_id not in sampled
        ]
        if missing:
            raise RuntimeError(f"runner output has no sampled token for {missing}")
        outputs: list[EngineOutput] = []
        for entry in scheduler_output.scheduled:
            if not entry.sample or not self._is_running(entry.request_id):
                continue  # a non-final prefill chunk, or aborted/preempted since scheduled
            request = self.requests[entry.request_id]
            tokens = [sampled[entry.request_id]]
            if entry.num_spec_tokens:
                draft = runner_output.drafts.get(entry.request_id)
                self.spec_policy.adapt(request, draft)
                tokens = [*self.spec_stats.settle(request, entry, draft, self.kv_cache), *tokens]
            output, status = append_tokens(
                request,
                tokens,
                runner_output.logprobs.get(entry.request_id),
                eos_token_ids=self.eos_token_ids,
                max_model_len=self.max_model_len,
            )
            if status is not None:
                self._finish(request, status)
            outputs.append(output)
        return outputs

    def discard(self, scheduler_output: SchedulerOutput) -> None:
        """The batch did not run (the runner raised): roll its requests back to where they
        were and withdraw the prefix-cache entries its KV would have filled."""
        for entry in scheduler_output.scheduled:
            request = self.requests.get(entry.request_id)
            if request is not None and request.status is RequestStatus.RUNNING:
                request.num_computed_tokens = entry.start_position
                self.kv_cache.uncache_blocks(request, entry.start_position)

    def fail_requests(
        self,
        scheduler_output: SchedulerOutput,
        errors: dict[str, str],
        recompute: Iterable[str] = (),
    ) -> list[EngineOutput]:
        """Settle a batch that failed in part (engine/core/isolation.py). Each request in `errors`
        made it fail: it finishes as ERROR, with one final output carrying the message. Each in
        `recompute` could not run (its KV depended on a failed one): it goes back to the
        waiting queue as if preempted. Either way the prefix-cache entries its KV of this step
        would have filled are withdrawn. The rest of the batch is not touched."""
        starts = {entry.request_id: entry.start_position for entry in scheduler_output.scheduled}
        for request_id in recompute:
            request = self.requests[request_id]
            self.kv_cache.uncache_blocks(request, starts[request_id])
            self._requeue(request)
        outputs = []
        for request_id, error in errors.items():
            request = self.requests[request_id]
            self.kv_cache.uncache_blocks(request, starts[request_id])
            self._finish(request, RequestStatus.FINISHED_ERROR)
            self.num_failed_requests += 1
            outputs.append(error_output(request, error))
        return outputs

    def _is_running(self, request_id: str) -> bool:
        request = self.requests.get(request_id)
        return request is not None and request.status is RequestStatus.RUNNING

    def _finish(self, request: Request, status: RequestStatus) -> None:
        """Leave the scheduler now: free the blocks, tell the runner with the next batch."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.status = status
        self.kv_cache.free(request)
        del self.requests[request.request_id]
        self._finished_ids.add(request.request_id)
