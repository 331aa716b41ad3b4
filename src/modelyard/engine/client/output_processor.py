"""Around the engine core, on the caller's side: prompts in, text out. The engine knows only token
ids; the server (`AsyncLLM`) and the offline `LLM` both wrap it with these steps:

1. a prompt becomes token ids (`prompt_ids`; chat messages through the tokenizer's template,
   `chat_template.render_chat`), checked against the context (`check_prompt_length`);
2. fan-out: `n > 1` becomes n `EngineRequest`s `{request_id}-{i}` with the same prompt ids (the
   prefix cache shares their blocks) and seed + i when seeded; `n == 1` keeps the request id
   (`RequestState.engine_requests`);
3. every `EngineOutput` is detokenized per completion (client/detokenizer.py); a stop string ends
   its completion (the caller aborts it in the engine: `RequestState.stopped_by_string`), and
   `RequestState.process` turns the outputs of a step into one `RequestOutput` with the deltas
   of the completions that changed; the last one has finished=True;
4. a consumer that has not taken one RequestOutput yet gets it merged with the next
   (`merge_outputs`): the same text and tokens, in fewer, larger updates.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import msgspec

from modelyard.engine.client.detokenizer import IncrementalDetokenizer
from modelyard.engine.client.protocol import (
    CompletionDelta,
    PromptTooLongError,
    RequestMetrics,
    RequestOutput,
    Tokenizer,
)
from modelyard.engine.messages import EngineOutput, EngineRequest, FinishReason, LoRARequest
from modelyard.engine.sampling_params import InvalidParamError, SamplingParams


def load_tokenizer(path: str) -> Tokenizer:
    """Load a Hugging Face tokenizer from a local folder (blocking: call it in a thread)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    # decode must not rewrite spaces, or incremental deltas would not add up to the full text
    tokenizer.clean_up_tokenization_spaces = False
    return cast(Tokenizer, tokenizer)


def prompt_ids(tokenizer: Tokenizer, prompt: str | Sequence[int]) -> list[int]:
    """A text prompt tokenized, or token ids as ints; ValueError when empty."""
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if not ids:
        raise ValueError("prompt must not be empty")
    return ids


def check_token_ids(prompt_ids: list[int], params: SamplingParams, vocab_size: int | None) -> None:
    """InvalidParamError for a prompt or stop token id outside [0, vocab_size)."""
    if vocab_size is None:
        return
    for param, ids in (("prompt", prompt_ids), ("stop_token_ids", params.stop_token_ids)):
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidParamError(
                param, f"holds token id {bad}, outside the vocabulary [0, {vocab_size})"
            )


def check_prompt_length(prompt_len: int, max_tokens: int | None, max_model_len: int) -> None:
    """PromptTooLongError when the prompt leaves no room, or prompt + max_tokens > context."""
    if prompt_len >= max_model_len or prompt_len + (max_tokens or 0) > max_model_len:
        raise PromptTooLongError(
            f"prompt has {prompt_len} tokens and max_tokens is {max_tokens}: together they "
            f"exceed the model's context of max_model_len={max_model_len} tokens"
        )


@dataclass(slots=True)
class _Completion:
    engine_id: str
    detokenizer: IncrementalDetokenizer
    finished: bool = False


class RequestState:
    """One prompt's n completions: fans the request out, turns EngineOutputs into
    RequestOutputs (see the module docstring)."""

    def __init__(
        self, request_id: str, prompt: list[int], params: SamplingParams, tokenizer: Tokenizer
    ) -> None:
        self.request_id = request_id
        self.prompt_ids = prompt
        self.params = params
        ids = [request_id] if params.n == 1 else [f"{request_id}-{i}" for i in range(params.n)]
        self.completions = {
            eid: (i, _Completion(eid, IncrementalDetokenizer(tokenizer, prompt, params)))
            for i, eid in enumerate(ids)
        }
        self.metrics = RequestMetrics(arrival_time=time.time())
        self.num_cached_tokens = 0
        self.num_generated = 0
        self.scheduled = False  # any output arrived: the engine has scheduled the request
        self.stopped_by_string: list[str] = []  # engine ids the caller must abort

    @property
    def finished(self) -> bool:
        return all(c.finished for _, c in self.completions.values())

    def unfinished_ids(self) -> list[str]:
        return [c.engine_id for _, c in self.completions.values() if not c.finished]

    def engine_requests(
        self, priority: int = 0, lora: LoRARequest | None = None
    ) -> list[EngineRequest]:
        """One EngineRequest per completion (n = 1 each, seed + i when seeded), with the LoRA
        adapter `lora` if given."""
        params = self.params
        return [
            EngineRequest(
                request_id=engine_id,
                prompt_token_ids=self.prompt_ids,
                sampling_params=msgspec.structs.replace(
                    params, n=1, seed=None if params.seed is None else params.seed + i
                ),
                priority=priority,
                arrival_time=self.metrics.arrival_time,
                lora=lora,
            )
            for engine_id, (i, _) in self.completions.items()
        ]

    def process(self, outputs: Sequence[EngineOutput]) -> RequestOutput | None:
        """The RequestOutput of these outputs (None when nothing changed)."""
        now = time.time()
        deltas = [d for d in (self._apply(o, now) for o in outputs) if d is not None]
        if not deltas:
            return None
        finished = self.finished
        if finished:
            self.metrics.finished_time = now
        return RequestOutput(
            request_id=self.request_id,
            deltas=deltas,
            num_prompt_tokens=len(self.prompt_ids),
            num_cached_tokens=self.num_cached_tokens,
            num_generated_tokens=self.num_generated,
            finished=finished,
            metrics=self.metrics,
        )

    def take_stopped(self) -> list[str]:
        """The engine ids a stop string ended since the last call (to abort in the engine)."""
        stopped, self.stopped_by_string = self.stopped_by_string, []
        return stopped

    def _apply(self, output: EngineOutput, now: float) -> CompletionDelta | None:
        index, completion = self.completions[output.request_id]
        if completion.finished:
            return None
        self.scheduled = True
        finish = output.finish_reason
        detok = completion.detokenizer.update(output.new_token_ids, finished=finish is not None)
        if detok.num_tokens < len(output.new_token_ids):  # a stop string inside the run
            kept = output.new_token_ids[: detok.num_tokens]
            output = msgspec.structs.replace(output, new_token_ids=kept)
        self._update_metrics(output, now)
        stop_reason: str | int | None = output.stop_reason
        if detok.stop_string is not None:
            stop_reason = detok.stop_string
            if finish is None:
                self.stopped_by_string.append(output.request_id)
            finish = FinishReason.STOP
        completion.finished = finish is not None
        if not (detok.text or output.new_token_ids or finish):
            return None
        return CompletionDelta(
            index=index,
            text=detok.text,
            token_ids=list(output.new_token_ids),
            logprobs=output.new_logprobs,
            finish_reason=finish,
            stop_reason=stop_reason if finish is not None else None,
            error=output.error,
        )

    def _update_metrics(self, output: EngineOutput, now: float) -> None:
        m = self.metrics
        if output.first_scheduled_time is not None and (
            m.first_scheduled_time is None or output.first_scheduled_time < m.first_scheduled_time
        ):
            m.first_scheduled_time = output.first_scheduled_time
        if output.new_token_ids:
            if m.first_token_time is None:
                m.first_token_time = now
            m.last_token_time = now
            self.num_generated += len(output.new_token_ids)
        self.num_cached_tokens = max(self.num_cached_tokens, output.num_cached_tokens)


def merge_outputs(older: RequestOutput, newer: RequestOutput) -> RequestOutput:
    """One RequestOutput that says what `older` then `newer` said: each completion's deltas
    joined (text, token ids, logprobs), the newer counts, finish state and metrics."""
    deltas = {d.index: d for d in older.deltas}
    for delta in newer.deltas:
        before = deltas.get(delta.index)
        deltas[delta.index] = delta if before is None else _join(before, delta)
    return RequestOutput(
        request_id=newer.request_id,
        deltas=list(deltas.values()),
        num_prompt_tokens=newer.num_prompt_tokens,
        num_cached_tokens=newer.num_cached_tokens,
        num_generated_tokens=newer.num_generated_tokens,
        finished=newer.finished,
        metrics=newer.metrics,
    )


def _join(before: CompletionDelta, after: CompletionDelta) -> CompletionDelta:
    logprobs = None
    if before.logprobs is not None or after.logprobs is not None:
        logprobs = [*(before.logprobs or ()), *(after.logprobs or ())]
    return CompletionDelta(
        index=after.index,
        text=before.text + after.text,
        token_ids=before.token_ids + after.token_ids,
        logprobs=logprobs,
        finish_reason=after.finish_reason or before.finish_reason,
        stop_reason=after.stop_reason if after.finish_reason else before.stop_reason,
        error=after.error or before.error,
    )
