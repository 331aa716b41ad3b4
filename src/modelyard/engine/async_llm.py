"""`AsyncLLM`: the `LLMClient` the API process uses, over an engine worker process.

Pipeline of one `generate` call (all on the event loop, nothing blocking):

1. validate the SamplingParams (ValueError), tokenize a str prompt (ids pass through), check
   prompt length + max_tokens against max_model_len (PromptTooLongError);
2. admission: a bounded waiting queue. A call counts as waiting from acceptance until its first
   output arrives (i.e. until the engine scheduled it); when `max_waiting_requests` calls or
   `max_waiting_prompt_tokens` prompt tokens are waiting, EngineOverloadedError (retry_after_s);
3. fan-out: n > 1 becomes n EngineRequests `{request_id}-{i}` with the same prompt ids (the prefix
   cache shares their blocks) and seed + i when seeded; n == 1 keeps the request id;
4. streaming: every EngineOutput is detokenized per completion (engine/detokenizer.py); stop
   strings end a completion and abort it in the engine; a RequestOutput with the deltas of the
   completions that changed is yielded; the last one has finished=True;
5. leaving early (aclose, cancellation, consumer error) aborts what is still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import msgspec

from modelyard.engine.client import EngineCoreClient, OutputQueue
from modelyard.engine.config import EngineConfig
from modelyard.engine.detokenizer import IncrementalDetokenizer
from modelyard.engine.messages import (
    DropLoRAs,
    EngineOutput,
    EngineReady,
    EngineRequest,
    FinishReason,
    LoRARequest,
    SchedulerStats,
)
from modelyard.engine.protocol import (
    CompletionDelta,
    EngineDeadError,
    EngineOverloadedError,
    PromptTooLongError,
    RequestMetrics,
    RequestOutput,
    Tokenizer,
)
from modelyard.engine.sampling_params import SamplingParams

#: Prompts longer than this many characters are tokenized in a thread.
_THREAD_TOKENIZE_CHARS = 4096


@dataclass(slots=True)
class _Completion:
    engine_id: str
    detokenizer: IncrementalDetokenizer
    finished: bool = False


class _RequestState:
    """Turns the EngineOutputs of one generate call's n completions into RequestOutputs."""

    def __init__(self, request_id: str, prompt_ids: list[int], completions: list[_Completion]):
        self.request_id = request_id
        self.num_prompt_tokens = len(prompt_ids)
        self.completions = {c.engine_id: (i, c) for i, c in enumerate(completions)}
        self.metrics = RequestMetrics(arrival_time=time.time())
        self.num_cached_tokens = 0
        self.num_generated = 0
        self.scheduled = False  # any output arrived: the engine has scheduled the call
        self.counted = True  # still counted in AsyncLLM's waiting queue
        self.stopped_by_string: list[str] = []  # engine ids to abort (stop string matched)

    @property
    def finished(self) -> bool:
        return all(c.finished for _, c in self.completions.values())

    def unfinished_ids(self) -> list[str]:
        return [c.engine_id for _, c in self.completions.values() if not c.finished]

    def process(self, outputs: list[EngineOutput]) -> RequestOutput | None:
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
            num_prompt_tokens=self.num_prompt_tokens,
            num_cached_tokens=self.num_cached_tokens,
            num_generated_tokens=self.num_generated,
            finished=finished,
            metrics=self.metrics,
        )

    def _apply(self, output: EngineOutput, now: float) -> CompletionDelta | None:
        index, completion = self.completions[output.request_id]
        if completion.finished:
            return None
        self.scheduled = True
        finish = output.finish_reason
        detok = completion.detokenizer.update(output.new_token_ids, finished=finish is not None)
        if detok.num_tokens < len(output.new_token_ids):  # a stop string inside the run
            output = msgspec.structs.replace(
                output, new_token_ids=output.new_token_ids[: detok.num_tokens]
            )
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


class AsyncLLM:
    """An LLMClient over one engine worker (see the module docstring for the pipeline)."""

    def __init__(
        self,
        client: EngineCoreClient,
        tokenizer: Tokenizer,
        *,
        model_name: str,
        max_waiting_requests: int = 256,
        max_waiting_prompt_tokens: int = 256 * 1024,
    ) -> None:
        """Wrap a ready client; `start` is the usual way in."""
        if max_waiting_requests < 1 or max_waiting_prompt_tokens < 1:
            raise ValueError("max_waiting_requests and max_waiting_prompt_tokens must be >= 1")
        self._client = client
        self._tokenizer = tokenizer
        self._model_name = model_name
        self._max_waiting_requests = max_waiting_requests
        self._max_waiting_prompt_tokens = max_waiting_prompt_tokens
        self._waiting_requests = 0
        self._waiting_prompt_tokens = 0
        self._live: dict[str, _RequestState] = {}

    @classmethod
    async def start(
        cls,
        config: EngineConfig,
        *,
        model_name: str,
        max_waiting_requests: int = 256,
        max_waiting_prompt_tokens: int = 256 * 1024,
        ready_timeout_s: float = 600.0,
        heartbeat_timeout_s: float = 30.0,
    ) -> AsyncLLM:
        """Spawn the worker, wait until it is ready, load the tokenizer (in a thread)."""
        client = await EngineCoreClient.start(
            config, ready_timeout_s=ready_timeout_s, heartbeat_timeout_s=heartbeat_timeout_s
        )
        try:
            tokenizer = await asyncio.to_thread(load_tokenizer, client.ready.tokenizer_path)
        except BaseException:
            await client.shutdown()
            raise
        return cls(
            client,
            tokenizer,
            model_name=model_name,
            max_waiting_requests=max_waiting_requests,
            max_waiting_prompt_tokens=max_waiting_prompt_tokens,
        )

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def max_model_len(self) -> int:
        return self._client.ready.max_model_len

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def ready(self) -> EngineReady:
        """What the worker reported at start (blocks, dtype, paths, RSS)."""
        return self._client.ready

    @property
    def engine_client(self) -> EngineCoreClient:
        return self._client

    @property
    def pid(self) -> int | None:
        """The engine worker's process id (the manager measures its RSS)."""
        return self._client.pid

    @property
    def is_alive(self) -> bool:
        return self._client.is_alive

    def stats(self) -> SchedulerStats:
        return self._client.stats()

    def num_waiting(self) -> int:
        """generate calls accepted but not yet scheduled by the engine."""
        return self._waiting_requests

    def apply_chat_template(self, messages: Sequence[dict[str, str]]) -> list[int]:
        render = cast(Any, self._tokenizer).apply_chat_template
        text = render(list(messages), tokenize=False, add_generation_prompt=True)
        return self._tokenizer.encode(str(text), add_special_tokens=False)

    async def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str,
        *,
        priority: int = 0,
        lora: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream the request's outputs (see LLMClient.generate for the error contract)."""
        params.validate()
        prompt_ids = await self._tokenize(prompt)
        check_prompt_length(len(prompt_ids), params.max_tokens, self.max_model_len)
        if not self._client.is_alive:
            raise EngineDeadError(f"engine is not running: {self._client.dead_reason}")
        if request_id in self._live:
            raise ValueError(f"request id {request_id!r} is already in flight")
        self._admit(len(prompt_ids))
        state = self._new_state(request_id, prompt_ids, params)
        self._live[request_id] = state
        try:
            queue = await self._submit(state, prompt_ids, params, priority, lora)
            while not state.finished:
                output = await self._next_output(state, queue)
                if output is not None:
                    yield output
        finally:
            self._release(state)
            self._live.pop(request_id, None)
            if not state.finished and self._client.is_alive:
                with contextlib.suppress(Exception):
                    await self._client.abort(state.unfinished_ids())

    async def abort(self, request_id: str) -> None:
        """Abort a live request: its stream ends with finish_reason ABORT."""
        state = self._live.get(request_id)
        if state is not None:
            await self._client.abort(state.unfinished_ids())

    async def drop_loras(self, names: list[str]) -> None:
        if self._client.is_alive:
            await self._client.send(DropLoRAs(names=list(names)))

    async def shutdown(self) -> None:
        await self._client.shutdown()

    async def _tokenize(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if len(prompt) > _THREAD_TOKENIZE_CHARS:
                ids = await asyncio.to_thread(self._tokenizer.encode, prompt)
            else:
                ids = self._tokenizer.encode(prompt)
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("prompt must not be empty")
        return ids

    def _admit(self, prompt_len: int) -> None:
        too_many = self._waiting_requests >= self._max_waiting_requests
        too_long = (
            self._waiting_prompt_tokens > 0
            and self._waiting_prompt_tokens + prompt_len > self._max_waiting_prompt_tokens
        )
        if too_many or too_long:
            raise EngineOverloadedError(
                f"engine overloaded: {self._waiting_requests} requests with "
                f"{self._waiting_prompt_tokens} prompt tokens are waiting "
                f"(limits {self._max_waiting_requests} / {self._max_waiting_prompt_tokens})",
                retry_after_s=1.0,
            )
        self._waiting_requests += 1
        self._waiting_prompt_tokens += prompt_len

    def _release(self, state: _RequestState) -> None:
        """Leave the waiting count (once: on the first output, or when the call ends)."""
        if state.counted:
            state.counted = False
            self._waiting_requests -= 1
            self._waiting_prompt_tokens -= state.num_prompt_tokens

    def _new_state(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams
    ) -> _RequestState:
        ids = [request_id] if params.n == 1 else [f"{request_id}-{i}" for i in range(params.n)]
        completions = [
            _Completion(eid, IncrementalDetokenizer(self._tokenizer, prompt_ids, params))
            for eid in ids
        ]
        return _RequestState(request_id, prompt_ids, completions)

    async def _submit(
        self,
        state: _RequestState,
        prompt_ids: list[int],
        params: SamplingParams,
        priority: int,
        lora: LoRARequest | None,
    ) -> OutputQueue:
        queue: OutputQueue = asyncio.Queue()
        for i, engine_id in enumerate(state.unfinished_ids()):
            seed = None if params.seed is None else params.seed + i
            request = EngineRequest(
                request_id=engine_id,
                prompt_token_ids=prompt_ids,
                sampling_params=msgspec.structs.replace(params, n=1, seed=seed),
                priority=priority,
                arrival_time=state.metrics.arrival_time,
                lora=lora,
            )
            await self._client.add_request(request, queue)
        return queue

    async def _next_output(self, state: _RequestState, queue: OutputQueue) -> RequestOutput | None:
        items = [await queue.get()]
        while not queue.empty():
            items.append(queue.get_nowait())
        outputs: list[EngineOutput] = []
        for item in items:
            if isinstance(item, EngineDeadError):
                raise item
            outputs.append(item)
        output = state.process(outputs)
        if state.scheduled:
            self._release(state)
        if state.stopped_by_string:
            to_abort, state.stopped_by_string = state.stopped_by_string, []
            await self._client.abort(to_abort)
        return output


def check_prompt_length(prompt_len: int, max_tokens: int | None, max_model_len: int) -> None:
    """PromptTooLongError when the prompt leaves no room, or prompt + max_tokens > context."""
    if prompt_len >= max_model_len or prompt_len + (max_tokens or 0) > max_model_len:
        raise PromptTooLongError(
            f"prompt has {prompt_len} tokens and max_tokens is {max_tokens}: together they "
            f"exceed the model's context of max_model_len={max_model_len} tokens"
        )


def load_tokenizer(path: str) -> Tokenizer:
    """Load a Hugging Face tokenizer from a local folder (blocking: call it in a thread)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    # decode must not rewrite spaces, or incremental deltas would not add up to the full text
    tokenizer.clean_up_tokenization_spaces = False
    return cast(Tokenizer, tokenizer)
