"""`LLM`: offline batch generation, `modelyard.LLM(model).generate(prompts, SamplingParams(...))`.

Unlike the server's AsyncLLM, this runs the engine core in the calling process: no worker
process, no IPC, no event loop. All prompts are queued at once and the core steps until every
request finished, so continuous batching, the prefix cache and chunked prefill work exactly as
in the server. Text comes from the same incremental detokenizer (stop strings included), so
offline and served outputs agree. Blocking by design; do not call it from an event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import msgspec

from modelyard.engine.async_llm import check_prompt_length, load_tokenizer
from modelyard.engine.config import (
    CacheConfig,
    Dtype,
    EngineConfig,
    Implementation,
    LoRAConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from modelyard.engine.detokenizer import IncrementalDetokenizer
from modelyard.engine.messages import (
    EngineOutput,
    EngineRequest,
    FinishReason,
    LoRARequest,
    SchedulerStats,
)
from modelyard.engine.protocol import Tokenizer
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


@dataclass(slots=True)
class _Live:
    result: GenerationResult
    completion: Completion
    detokenizer: IncrementalDetokenizer


class LLM:
    """An engine in this process. Options are those of ModelConfig / CacheConfig /
    SchedulerConfig, flattened (e.g. `LLM(path, dtype="bfloat16", max_num_seqs=32)`), and
    `speculative` / `lora` (a SpeculativeConfig / LoRAConfig, or a dict of its fields)."""

    def __init__(
        self,
        model: str,
        *,
        dtype: Dtype = "float32",
        max_model_len: int | None = None,
        implementation: Implementation = "auto",
        num_threads: int | None = None,
        speculative: SpeculativeConfig | dict[str, Any] | None = None,
        lora: LoRAConfig | dict[str, Any] | None = None,
        **engine_options: Any,
    ) -> None:
        from modelyard.engine.core import EngineCore
        from modelyard.runner.model_runner import ModelRunner

        model_config = ModelConfig(
            model=model,
            dtype=dtype,
            max_model_len=max_model_len,
            implementation=implementation,
            num_threads=num_threads,
        )
        if isinstance(speculative, dict):
            speculative = SpeculativeConfig(**speculative)
        if isinstance(lora, dict):
            lora = LoRAConfig(**lora)
        self.config = EngineConfig(
            model=model_config, speculative=speculative, lora=lora, **_split_options(engine_options)
        )
        self.runner = ModelRunner(self.config.model, self.config.cache, speculative, lora)
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
        results: list[GenerationResult] = []
        requests: list[EngineRequest] = []
        live: dict[str, _Live] = {}
        for i, prompt in enumerate(items):
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
            if not ids:
                raise ValueError(f"prompt {i} is empty")
            check_prompt_length(len(ids), params.max_tokens, self.max_model_len)
            result = GenerationResult(prompt=prompt, prompt_token_ids=ids, completions=[])
            results.append(result)
            for j in range(params.n):
                seed = None if params.seed is None else params.seed + j
                request_id = f"{i}-{j}"
                sub = msgspec.structs.replace(params, n=1, seed=seed)
                requests.append(
                    EngineRequest(
                        request_id=request_id, prompt_token_ids=ids, sampling_params=sub, lora=lora
                    )
                )
                completion = Completion()
                result.completions.append(completion)
                live[request_id] = _Live(
                    result, completion, IncrementalDetokenizer(self.tokenizer, ids, sub)
                )
        for request in requests:
            self.core.add_request(request)
        self._run(live)
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
        render = cast(Any, self.tokenizer).apply_chat_template
        prompts = [
            self.tokenizer.encode(
                str(render(list(messages), tokenize=False, add_generation_prompt=True)),
                add_special_tokens=False,
            )
            for messages in cast(Sequence[Sequence[dict[str, str]]], batch)
        ]
        return self.generate(prompts, params, lora)

    def _run(self, live: dict[str, _Live]) -> None:
        """Step the core until every request finished (stop strings abort theirs)."""
        while self.core.has_unfinished_requests():
            to_abort = [
                output.request_id
                for output in self.core.step()
                if output.request_id in live and self._apply(live, output)
            ]
            if to_abort:
                self.core.abort_requests(to_abort)

    @staticmethod
    def _apply(live: dict[str, _Live], output: EngineOutput) -> bool:
        """Record one output; True when a stop string ended a request the core still runs."""
        entry = live[output.request_id]
        completion = entry.completion
        entry.result.num_cached_tokens = max(
            entry.result.num_cached_tokens, output.num_cached_tokens
        )
        finish = output.finish_reason
        delta = entry.detokenizer.update(output.new_token_ids, finished=finish is not None)
        completion.token_ids.extend(output.new_token_ids[: delta.num_tokens])
        completion.text += delta.text
        completion.stop_reason = output.stop_reason
        completion.error = output.error
        if delta.stop_string is not None:
            completion.stop_reason = delta.stop_string
            completion.finish_reason = FinishReason.STOP
            del live[output.request_id]
            return finish is None
        if finish is not None:
            completion.finish_reason = finish
            del live[output.request_id]
        return False


def _as_prompt(prompt: str | Sequence[int]) -> str | list[int]:
    return prompt if isinstance(prompt, str) else [int(t) for t in prompt]


def _split_options(options: dict[str, Any]) -> dict[str, Any]:
    """Sort flat keyword options into CacheConfig / SchedulerConfig; ValueError on unknown."""
    cache_fields = set(CacheConfig.__dataclass_fields__)
    scheduler_fields = set(SchedulerConfig.__dataclass_fields__)
    unknown = set(options) - cache_fields - scheduler_fields
    if unknown:
        raise ValueError(f"unknown engine options: {sorted(unknown)}")
    return {
        "cache": CacheConfig(**{k: v for k, v in options.items() if k in cache_fields}),
        "scheduler": SchedulerConfig(**{k: v for k, v in options.items() if k in scheduler_fields}),
    }
