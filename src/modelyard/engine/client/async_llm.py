"""`AsyncLLM`: the `LLMClient` the API process uses, over an engine worker process.

Pipeline of one `generate` call (all on the event loop, nothing blocking):

1. validate the SamplingParams (ValueError), tokenize a str prompt (ids pass through, each
   within the model's vocabulary, as the stop token ids: InvalidParamError), check prompt
   length + max_tokens against max_model_len (PromptTooLongError);
2. admission: a bounded waiting queue. A call counts as waiting from acceptance until its first
   output arrives (i.e. until the engine scheduled it); when `max_waiting_requests` calls or
   `max_waiting_prompt_tokens` prompt tokens are waiting, EngineOverloadedError (retry_after_s);
3. fan-out, then streaming: `output_processor.RequestState` makes the n EngineRequests and turns
   what comes back into RequestOutputs (detokenized per completion, stop strings applied: those
   completions are aborted in the engine); the last one has finished=True. The outputs are
   processed as the engine's message is read (`OutputCollector`: one pass per engine step for
   every request, not one task wake-up per token); the call wakes once per step with the
   update, or with several merged when it fell behind;
4. leaving early (aclose, cancellation, consumer error) aborts what is still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
from collections.abc import AsyncIterator, Callable, Sequence

from modelyard.engine.client.chat_template import render_chat
from modelyard.engine.client.core_client import EngineCoreClient, QueueItem
from modelyard.engine.client.output_processor import (
    RequestState,
    check_prompt_length,
    check_token_ids,
    load_tokenizer,
    merge_outputs,
    prompt_ids,
)
from modelyard.engine.client.prefixes import EnginePrefixes, PrefixRegistry
from modelyard.engine.client.protocol import (
    LOCAL_ENGINE_CAPABILITIES,
    ChatMessageDict,
    EngineCapabilities,
    EngineDeadError,
    EngineOverloadedError,
    LLMClient,
    RequestOutput,
    Tokenizer,
)
from modelyard.engine.config import AdmissionConfig, EngineConfig
from modelyard.engine.messages import DropLoRAs, EngineReady, LoRARequest, SchedulerStats
from modelyard.engine.sampling_params import SamplingParams

#: Prompts longer than this many characters are tokenized in a thread.
_THREAD_TOKENIZE_CHARS = 4096


class AsyncLLM:
    """An LLMClient over one engine worker (see the module docstring for the pipeline)."""

    def __init__(
        self,
        client: EngineCoreClient,
        tokenizer: Tokenizer,
        *,
        model_name: str,
        admission: AdmissionConfig | None = None,
        capabilities: EngineCapabilities | None = None,
    ) -> None:
        """Wrap a ready client; `start` is the usual way in (it declares the capabilities the
        engine config gives: LoRA, speculation; pins, structured output and tools always)."""
        admission = admission or AdmissionConfig()
        self._capabilities = capabilities or LOCAL_ENGINE_CAPABILITIES
        self._client = client
        self._tokenizer = tokenizer
        self._model_name = model_name
        self._max_waiting_requests = admission.max_waiting_requests
        self._max_waiting_prompt_tokens = admission.max_waiting_prompt_tokens
        self._waiting_requests = 0
        self._waiting_prompt_tokens = 0
        self._waiting: dict[str, int] = {}  # request id -> prompt tokens, until scheduled
        self._live: dict[str, RequestState] = {}
        self._prefixes: EnginePrefixes | None = None

    @classmethod
    async def start(
        cls,
        config: EngineConfig,
        *,
        model_name: str,
        ready_timeout_s: float = 600.0,
        heartbeat_timeout_s: float = 30.0,
    ) -> AsyncLLM:
        """Start the worker, wait until it is ready, load the tokenizer (in a thread); the
        waiting queue's limits are config.admission."""
        client = await EngineCoreClient.start(
            config, ready_timeout_s=ready_timeout_s, heartbeat_timeout_s=heartbeat_timeout_s
        )
        try:
            tokenizer = await asyncio.to_thread(load_tokenizer, client.ready.tokenizer_path)
        except BaseException:
            await client.shutdown()
            raise
        # the tokenizer's import brings transformers and torch: ~365k long-lived objects that
        # every full collection would walk (~120-190 ms holding the GIL, several times a
        # minute under load, each a stall of every stream and a core taken from the engine);
        # frozen, they are never scanned again (gc.freeze is O(1): no collection runs here)
        gc.freeze()
        return cls(
            client,
            tokenizer,
            model_name=model_name,
            admission=config.admission,
            capabilities=dataclasses.replace(
                LOCAL_ENGINE_CAPABILITIES,
                lora=config.lora is not None,
                speculation=config.speculative is not None,
            ),
        )

    @property
    def capabilities(self) -> EngineCapabilities:
        return self._capabilities

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
    def vocab_size(self) -> int | None:
        """Token ids the model accepts are in [0, vocab_size) (None: the worker did not say)."""
        return self._client.ready.vocab_size or None

    @property
    def ready(self) -> EngineReady:
        """What the worker reported at start (blocks, dtype, paths, RSS)."""
        return self._client.ready

    @property
    def prefixes(self) -> EnginePrefixes:
        """This engine's pinned prefixes (CAG): pin, list, release (engine/client/prefixes.py)."""
        if self._prefixes is None:
            ready = self._client.ready
            registry = PrefixRegistry(
                model=self._model_name,
                block_size=ready.block_size,
                max_pinned_blocks=ready.max_pinned_blocks,
                max_model_len=ready.max_model_len,
            )
            self._prefixes = EnginePrefixes(self._client, registry)
        return self._prefixes

    @property
    def holds_pinned_prefixes(self) -> bool:
        """True while a pinned prefix lives in this engine (the manager keeps it loaded)."""
        return self._prefixes is not None and bool(self._prefixes.list())

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

    def apply_chat_template(
        self, messages: Sequence[ChatMessageDict], tools: Sequence[ChatMessageDict] | None = None
    ) -> list[int]:
        return render_chat(self._tokenizer, messages, tools)

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
        ids = await self._tokenize(prompt)
        check_token_ids(ids, params, self.vocab_size)
        check_prompt_length(len(ids), params.max_tokens, self.max_model_len)
        if not self._client.is_alive:
            raise EngineDeadError(f"engine is not running: {self._client.dead_reason}")
        if request_id in self._live:
            raise ValueError(f"request id {request_id!r} is already in flight")
        self._admit(request_id, len(ids))
        state = RequestState(request_id, ids, params, self._tokenizer)
        collector = OutputCollector(state, lambda: self._release(request_id))
        self._live[request_id] = state
        try:
            for request in state.engine_requests(priority, lora):
                await self._client.send_request(request, collector)
            finished = False
            while not finished:
                output = await collector.get()
                to_abort = state.take_stopped()
                if to_abort:
                    await self._client.abort(to_abort)
                finished = output.finished
                yield output
        finally:
            self._release(request_id)
            self._live.pop(request_id, None)
            to_abort = state.take_stopped() + state.unfinished_ids()
            if to_abort and self._client.is_alive:
                with contextlib.suppress(Exception):
                    await self._client.abort(to_abort)

    async def abort(self, request_id: str) -> None:
        """Abort a live request: its stream ends with finish_reason ABORT."""
        state = self._live.get(request_id)
        if state is not None:
            await self._client.abort(state.unfinished_ids())

    async def drop_loras(self, names: list[str]) -> None:
        if self._capabilities.lora and self._client.is_alive:
            await self._client.send(DropLoRAs(names=list(names)))

    async def shutdown(self) -> None:
        await self._client.shutdown()

    async def _tokenize(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str) and len(prompt) > _THREAD_TOKENIZE_CHARS:
            return await asyncio.to_thread(prompt_ids, self._tokenizer, prompt)
        return prompt_ids(self._tokenizer, prompt)

    def _admit(self, request_id: str, prompt_len: int) -> None:
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
        self._waiting[request_id] = prompt_len

    def _release(self, request_id: str) -> None:
        """Leave the waiting count (once: on the first output, or when the call ends)."""
        prompt_len = self._waiting.pop(request_id, None)
        if prompt_len is not None:
            self._waiting_requests -= 1
            self._waiting_prompt_tokens -= prompt_len


class OutputCollector:
    """The output sink of one generate call (core_client.OutputSink). Each EngineOutput is
    processed when the reader task takes the step's message off the socket; the RequestOutputs
    the consumer has not taken yet are merged into one (output_processor.merge_outputs), so the
    consumer wakes at most once per step and a slow one gets fewer, larger updates. An error
    (the engine died, or processing failed) is raised by the next `get`."""

    __slots__ = ("_error", "_on_output", "_pending", "_state", "_waiter")

    def __init__(self, state: RequestState, on_output: Callable[[], None]) -> None:
        self._state = state
        self._on_output = on_output  # the request was scheduled: leave the waiting count
        self._pending: RequestOutput | None = None
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: QueueItem, /) -> None:
        if isinstance(item, BaseException):
            self._error = item
        else:
            try:
                output = self._state.process([item])
            except Exception as exc:  # a tokenizer failure fails this request, not the reader
                self._error = RuntimeError(f"output processing failed: {exc!r}")
                output = None
            self._on_output()
            if output is None:
                if self._error is None:
                    return
            elif self._pending is None:
                self._pending = output
            else:
                self._pending = merge_outputs(self._pending, output)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> RequestOutput:
        """The next (merged) RequestOutput; raises the error that ended the request."""
        while self._pending is None:
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        output, self._pending = self._pending, None
        return output


def _conforms(llm: AsyncLLM) -> LLMClient:
    """mypy checks here that AsyncLLM implements the whole engine client protocol."""
    return llm
