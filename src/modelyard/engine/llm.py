"""`LLM`: offline batch generation, `modelyard.LLM(model).generate(prompts, SamplingParams(...))`.

Unlike the server's AsyncLLM, this runs the engine core in the calling process: no worker
process, no IPC, no event loop. All prompts are queued at once and the core steps until every
request finished, so continuous batching, the prefix cache and chunked prefill work exactly as
in the server. Fan-out, text and stop strings come from the same output processor
(engine/client/output_processor.py), so offline and served outputs agree. Blocking by design; do not
call it from an event loop. As the config layer of its process, it reads the kernel switches from
the environment (engine.config) and puts ninja on PATH for a first-use kernel build.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from modelyard.build_tools import path_with_ninja
from modelyard.engine.client.chat_template import render_chat
from modelyard.engine.client.output_processor import (
    RequestState,
    check_prompt_length,
    load_tokenizer,
    prompt_ids,
)
from modelyard.engine.client.protocol import RequestOutput, Tokenizer
from modelyard.engine.config import EngineConfig, LoRAConfig, SpeculativeConfig
from modelyard.engine.messages import FinishReason, LoRARequest, SchedulerStats
from modelyard.engine.sampling_params import SamplingParams


@dataclass(slots=True)
class Completion:
    """One of a prompt's n completions."""

    text: str = ""  # detokenized, stop string trimmed
    token_ids: list[int] = field(default_factory=list)  # every generated id
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    error: str | None = None  # with FinishReason.ERROR


@dataclass(slots=True)
class GenerationResult:
    """The result for one prompt, in input order. text/token_ids/finish_reason are those of
    the first completion (the only one unless n > 1)."""

    prompt: str | list[int]  # as given
    prompt_token_ids: list[int]
    completions: list[Completion]
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache

    @property
    def text(self) -> str:
        return self.completions[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.completions[0].token_ids

    @property
    def finish_reason(self) -> FinishReason | None:
        return self.completions[0].finish_reason


class LLM:
    """An engine in this process. Options are the fields of ModelConfig / CacheConfig /
    SchedulerConfig, flattened (e.g. `LLM(path, dtype="bfloat16", max_num_seqs=32)`), read by
    `EngineConfig.from_options` as a catalog entry's are (ValueError for an unknown one), plus
    `speculative` / `lora`: a SpeculativeConfig / LoRAConfig or a dict of its fields."""

    def __init__(
        self,
        model: str,
        *,
        speculative: SpeculativeConfig | dict[str, Any] | None = None,
        lora: LoRAConfig | dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        from modelyard.engine.core.engine_core import EngineCore
        from modelyard.runner.model_runner import ModelRunner

        if isinstance(speculative, dict):
            speculative = SpeculativeConfig(**speculative)
        if isinstance(lora, dict):
            lora = LoRAConfig(**lora)
        config = EngineConfig.from_options(model, options)
        self.config = dataclasses.replace(config, speculative=speculative, lora=lora)
        # this process may build the kernels on first use: torch's builder runs ninja from PATH
        os.environ["PATH"] = path_with_ninja(os.environ)
        self.runner = ModelRunner(
            self.config.model, self.config.cache, speculative, lora, kernels=self.config.kernels
        )
        self.core = EngineCore(self.config, self.runner)
        self.tokenizer: Tokenizer = load_tokenizer(self.runner.tokenizer_path)

    @property
    def max_model_len(self) -> int:
        return self.runner.max_model_len

    def stats(self) -> SchedulerStats:
        return self.core.stats()

    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[list[int]],
        params: SamplingParams | None = None,
        lora: LoRARequest | None = None,
    ) -> list[GenerationResult]:
        """Generate for every prompt (text, or token ids), with the LoRA adapter `lora` if
        given; results in input order. Raises ValueError / PromptTooLongError before anything
        runs when an input is invalid."""
        params = (params or SamplingParams()).validate()
        items: list[str | list[int]] = (
            [prompts] if isinstance(prompts, str) else [_as_prompt(p) for p in prompts]
        )
        states: list[RequestState] = []
        for i, prompt in enumerate(items):
            try:
                ids = prompt_ids(self.tokenizer, prompt)
            except ValueError as exc:
                raise ValueError(f"prompt {i}: {exc}") from None
            check_prompt_length(len(ids), params.max_tokens, self.max_model_len)
            states.append(RequestState(str(i), ids, params, self.tokenizer))
        results = [
            GenerationResult(
                prompt=prompt,
                prompt_token_ids=state.prompt_ids,
                completions=[Completion() for _ in range(params.n)],
            )
            for prompt, state in zip(items, states, strict=True)
        ]
        for state in states:
            for request in state.engine_requests(lora=lora):
                self.core.add_request(request)
        self._run(states, results)
        return results

    def chat(
        self,
        conversations: Sequence[dict[str, str]] | Sequence[Sequence[dict[str, str]]],
        params: SamplingParams | None = None,
        lora: LoRARequest | None = None,
    ) -> list[GenerationResult]:
        """Apply the tokenizer's chat template (with the generation prompt) to one
        conversation or a list of them, then generate."""
        batch = (
            [conversations]
            if conversations and isinstance(conversations[0], dict)
            else conversations
        )
        prompts = [
            render_chat(self.tokenizer, messages)
            for messages in cast(Sequence[Sequence[dict[str, str]]], batch)
        ]
        return self.generate(prompts, params, lora)

    def _run(self, states: list[RequestState], results: list[GenerationResult]) -> None:
        """Step the core until every request finished (stop strings abort theirs)."""
        owner = {
            engine_id: (state, result)
            for state, result in zip(states, results, strict=True)
            for engine_id in state.unfinished_ids()
        }
        while self.core.has_unfinished_requests():
            to_abort: list[str] = []
            for output in self.core.step():
                if output.request_id not in owner:
                    continue
                state, result = owner[output.request_id]
                update = state.process([output])
                if update is not None:
                    _record(result, update)
                to_abort += state.take_stopped()
            if to_abort:
                self.core.abort_requests(to_abort)


def _record(result: GenerationResult, update: RequestOutput) -> None:
    """Add one step's deltas to the completions they belong to."""
    result.num_cached_tokens = update.num_cached_tokens
    for delta in update.deltas:
        completion = result.completions[delta.index]
        completion.text += delta.text
        completion.token_ids.extend(delta.token_ids)
        completion.error = delta.error
        if delta.finish_reason is not None:
            completion.finish_reason = delta.finish_reason
            completion.stop_reason = delta.stop_reason


def _as_prompt(prompt: str | Sequence[int]) -> str | list[int]:
    return prompt if isinstance(prompt, str) else [int(t) for t in prompt]
