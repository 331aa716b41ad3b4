"""Helpers for the issue-2 acceptance tests through the whole engine (scheduler + KV cache +
real ModelRunner, in this process): a greedy transformers reference (one prompt at a time,
memoized), a driver that runs requests through an EngineCore, the four greedy scenarios shared
by every model, and tiny random model builders.

A module with a unique name, since `conftest` is ambiguous when several areas have one.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from modelyard.engine.config import (
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    kernels_from_environment,
)
from modelyard.engine.core.engine_core import EngineCore
from modelyard.engine.core.scheduler_output import RunnerOutput, SchedulerOutput, StepRunner
from modelyard.engine.messages import EngineRequest, FinishReason, SchedulerStats
from modelyard.engine.sampling_params import SamplingParams
from modelyard.runner.kernel_config import KernelConfig
from modelyard.runner.model_runner import ModelRunner

KERNELS = kernels_from_environment()  # the switches of this test run's environment

BLOCK_SIZE = 16
MAX_TOKENS = 12
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)

#: 32 prompt lengths from 5 to 150 tokens, mostly short so the reference stays cheap.
BATCH_LENGTHS = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16, 17, 19, 21, 23, 25]
BATCH_LENGTHS += [28, 31, 33, 36, 40, 44, 48, 53, 58, 64, 72, 81, 96, 112, 131, 150]


def load_runner(
    model: str | Path,
    *,
    dtype: str = "float32",
    num_blocks: int = 256,
    implementation: str = "auto",
    kernels: KernelConfig = KERNELS,
) -> ModelRunner:
    """A real ModelRunner on one thread (the machine is shared); `kernels`: its kernel
    switches (by default this test run's environment's)."""
    return ModelRunner(
        ModelConfig(model=str(model), dtype=dtype, num_threads=1, implementation=implementation),  # type: ignore[arg-type]
        CacheConfig(block_size=BLOCK_SIZE, num_blocks=num_blocks),
        kernels=kernels,
    )


class BlockLimit:
    """A StepRunner over a real runner that reports fewer KV blocks than it allocated, so a
    scheduler built on it has a tiny KV cache (the scheduler only hands out ids below the
    limit) without loading the model again."""

    def __init__(self, runner: ModelRunner, num_blocks: int) -> None:
        if num_blocks > runner.num_kv_blocks:
            raise ValueError("the limit must not exceed the runner's blocks")
        self.runner = runner
        self.num_kv_blocks = num_blocks
        self.max_model_len = runner.max_model_len
        self.eos_token_ids = runner.eos_token_ids
        self.vocab_size = runner.vocab_size

    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        return self.runner.execute(scheduler_output)


def make_core(
    runner: StepRunner | ModelRunner,
    *,
    max_num_batched_tokens: int = 2048,
    max_num_seqs: int = 64,
    enable_prefix_caching: bool = True,
) -> EngineCore:
    """A fresh EngineCore (empty prefix cache, zeroed counters) on an already loaded runner."""
    config = EngineConfig(
        model=ModelConfig(model="preloaded"),  # the core never reads it: the runner is given
        cache=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=enable_prefix_caching),
        scheduler=SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens
        ),
    )
    return EngineCore(config, runner)


@dataclass
class EngineRun:
    """What running a set of requests to completion produced."""

    tokens: dict[str, list[int]] = field(default_factory=dict)  # request id -> output ids
    finish: dict[str, FinishReason] = field(default_factory=dict)  # request id -> reason
    first_output_step: dict[str, int] = field(default_factory=dict)  # 1-based step index
    num_cached: dict[str, int] = field(default_factory=dict)  # prefix-cache hit tokens
    steps: int = 0
    stats: SchedulerStats | None = None  # after the last step


def run_core(
    core: EngineCore,
    prompts: dict[str, list[int]],
    params: SamplingParams | dict[str, SamplingParams] = GREEDY,
    max_steps: int = 2000,
) -> EngineRun:
    """Add every prompt at once (in order), step until all finished; collect the outputs.
    `params` is one for all, or one per request id."""
    for request_id, ids in prompts.items():
        own = params[request_id] if isinstance(params, dict) else params
        core.add_request(
            EngineRequest(request_id=request_id, prompt_token_ids=ids, sampling_params=own)
        )
    run = EngineRun(tokens={rid: [] for rid in prompts})
    while core.has_unfinished_requests():
        if run.steps >= max_steps:
            raise AssertionError(f"no progress after {max_steps} steps: {core.stats()}")
        run.steps += 1
        for out in core.step():
            run.tokens[out.request_id].extend(out.new_token_ids)
            run.first_output_step.setdefault(out.request_id, run.steps)
            run.num_cached[out.request_id] = out.num_cached_tokens
            if out.finish_reason is not None:
                run.finish[out.request_id] = out.finish_reason
    run.stats = core.stats()
    return run


class HFReference:
    """transformers' greedy decoding on the same folder, one prompt at a time.

    `greedy`: `generate(do_sample=False)`, stopping at EOS like the engine; memoized per
    (dtype, prompt, max_new_tokens). With `teacher_forced=True`, `expected` instead runs ONE
    forward over prompt + the engine's tokens and takes transformers' argmax at every
    generated position: when that equals the engine's tokens (and EOS appears only last), it
    is exactly the sequence greedy `generate` produces, at a twelfth of the forward passes
    (used for the 135M model, whose per-token generate steps dominate the test time).
    """

    def __init__(
        self, folder: str | Path, *, teacher_forced: bool = False, source: Any = None
    ) -> None:
        """`source`: the weights (a runner.weights.WeightSource) when the folder has none (a
        GGUF model's config + tokenizer folder)."""
        self.folder = Path(folder)
        self.source = source
        self.teacher_forced = teacher_forced
        self._models: dict[str, Any] = {}
        self._memo: dict[tuple[str, tuple[int, ...], int], list[int]] = {}

    def _model(self, dtype: str) -> Any:
        if dtype not in self._models:
            from transformers import AutoModelForCausalLM

            from modelyard.runner.models.hf_generic import model_from_source

            if self.source is None:
                model = AutoModelForCausalLM.from_pretrained(
                    self.folder, dtype=getattr(torch, dtype)
                )
            else:
                model = model_from_source(self.folder, self.source, getattr(torch, dtype))
            model.eval()
            self._models[dtype] = model
        return self._models[dtype]

    @property
    def eos_token_ids(self) -> set[int]:
        eos = self._model("float32").generation_config.eos_token_id
        return {eos} if isinstance(eos, int) else set(eos or ())

    def greedy(
        self, prompt: Sequence[int], max_new_tokens: int = MAX_TOKENS, dtype: str = "float32"
    ) -> list[int]:
        key = (dtype, tuple(prompt), max_new_tokens)
        if key not in self._memo:
            ids = torch.tensor([list(prompt)])
            with torch.inference_mode():
                out = self._model(dtype).generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                )
            self._memo[key] = [int(t) for t in out[0, len(prompt) :]]
        return self._memo[key]

    def next_logits(self, ids: Sequence[int], dtype: str) -> torch.Tensor:
        """transformers' float32 view of its next-token logits after `ids` (one forward)."""
        with torch.inference_mode():
            logits = self._model(dtype)(torch.tensor([list(ids)]), logits_to_keep=1).logits
        return logits[0, -1].float()

    def forced_argmax(self, prompt: Sequence[int], tokens: Sequence[int], dtype: str) -> list[int]:
        """transformers' argmax after prompt + tokens[:i], for every i (one forward)."""
        if not tokens:
            return []
        ids = torch.tensor([[*prompt, *tokens[:-1]]])
        with torch.inference_mode():
            logits = self._model(dtype)(ids, logits_to_keep=len(tokens)).logits[0]
        return [int(t) for t in logits.argmax(-1)]

    def expected(
        self, prompt: Sequence[int], engine_tokens: Sequence[int], max_new_tokens: int, dtype: str
    ) -> list[int]:
        """The reference output to compare the engine's tokens with."""
        if not self.teacher_forced:
            return self.greedy(prompt, max_new_tokens, dtype)
        if len(engine_tokens) > max_new_tokens or self.eos_token_ids & set(engine_tokens[:-1]):
            return [-1]  # generate would have stopped earlier: cannot be equal
        return self.forced_argmax(prompt, engine_tokens, dtype)


def assert_equal_to_reference(
    run: EngineRun,
    prompts: dict[str, list[int]],
    ref: HFReference,
    max_tokens: int = MAX_TOKENS,
    dtype: str = "float32",
) -> None:
    expected = {
        rid: ref.expected(ids, run.tokens[rid], max_tokens, dtype) for rid, ids in prompts.items()
    }
    mismatches = {
        rid: (len(ids), expected[rid], run.tokens[rid])
        for rid, ids in prompts.items()
        if run.tokens[rid] != expected[rid]
    }
    assert not mismatches, f"(prompt len, transformers, engine) differ: {mismatches}"
    for rid, ids in prompts.items():
        tokens = run.tokens[rid]
        if len(tokens) == max_tokens:
            assert run.finish[rid] is FinishReason.LENGTH or tokens[-1] in ref.eos_token_ids
        else:
            assert run.finish[rid] is FinishReason.STOP, (rid, len(ids))
            assert tokens[-1] in ref.eos_token_ids, (rid, len(ids))


# ---------------------------------------------------------------- prompt sets


def mixed_prompts(corpus: Sequence[int], lengths: Sequence[int], tag: str) -> dict[str, list[int]]:
    """Slices of `corpus` with the given lengths at spread-out, unaligned offsets."""
    prompts: dict[str, list[int]] = {}
    for i, n in enumerate(lengths):
        start = (i * 37) % max(1, len(corpus) - n)
        prompts[f"{tag}-{i}"] = list(corpus[start : start + n])
        if len(prompts[f"{tag}-{i}"]) != n:
            raise ValueError(f"corpus too short for a {n}-token prompt")
    return prompts


def shared_prefix_prompts(
    prefix: Sequence[int], suffixes: Sequence[Sequence[int]]
) -> dict[str, list[int]]:
    return {f"sys-{i}": [*prefix, *suffix] for i, suffix in enumerate(suffixes)}


def common_prefix_len(prompts: Sequence[Sequence[int]]) -> int:
    n = 0
    while all(len(p) > n and p[n] == prompts[0][n] for p in prompts):
        n += 1
    return n


# ---------------------------------------------------------------- tiny random models


#: Large enough that greedy outputs depend on the context (the default 0.02 makes a tiny
#: model repeat one token whatever the prompt) while the top-2 logit gaps stay far above
#: float32 rounding.
INIT_RANGE = 0.2
TINY_VOCAB_EOS = 0  # "<|endoftext|>" in the engine tests' tokenizer (tests/integration/engine)
_TINY: dict[str, Path] = {}


def tiny_configs(vocab_size: int) -> dict[str, Any]:
    from transformers import GPT2Config, LlamaConfig, OPTConfig

    ids = {"vocab_size": vocab_size, "eos_token_id": TINY_VOCAB_EOS, "bos_token_id": TINY_VOCAB_EOS}
    return {
        "llama": LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            initializer_range=INIT_RANGE,
            **ids,
        ),
        "gpt2": GPT2Config(
            n_embd=64, n_layer=2, n_head=4, n_positions=256, initializer_range=INIT_RANGE, **ids
        ),
        "opt": OPTConfig(
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=256,
            word_embed_proj_dim=64,
            init_std=INIT_RANGE,
            pad_token_id=1,
            **ids,
        ),
    }


def tiny_model(name: str, root: Path, tokenizer_from: Path) -> Path:
    """A tiny random model (llama, gpt2 or opt) saved with save_pretrained under `root`, with
    the tokenizer files of `tokenizer_from`; built once per session."""
    if name not in _TINY:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        vocab_size = len(AutoTokenizer.from_pretrained(tokenizer_from))
        folder = root / name
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(tiny_configs(vocab_size)[name]).save_pretrained(folder)
        for item in tokenizer_from.iterdir():
            if item.name.startswith(("tokenizer", "special_tokens", "chat_template")):
                shutil.copy(item, folder / item.name)
        _TINY[name] = folder
    return _TINY[name]


def random_corpus(vocab_size: int, length: int = 400, seed: int = 0) -> list[int]:
    """Token ids without the special tokens (0..2), reproducible."""
    g = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(3, vocab_size, (length,), generator=g)]


# ---------------------------------------------------------------- the greedy scenarios


def check_batch(runner: ModelRunner, ref: HFReference, prompts: dict[str, list[int]]) -> EngineRun:
    """Every prompt at once: equal to the reference, continuous batching (not one at a time),
    and every block back on the free list afterwards."""
    run = run_core(make_core(runner), prompts)
    assert_equal_to_reference(run, prompts, ref)
    assert run.steps <= MAX_TOKENS + 1  # all prompts ran side by side
    assert run.stats is not None
    assert run.stats.num_free_blocks == runner.num_kv_blocks
    return run


def check_prefix_caching(
    runner: ModelRunner, ref: HFReference, prompts: dict[str, list[int]]
) -> EngineRun:
    """Prompts sharing a long prefix: later ones are served its full blocks from the cache."""
    shared_blocks = common_prefix_len(list(prompts.values())) // BLOCK_SIZE
    assert shared_blocks >= 3, "the shared prefix must span several blocks"
    run = run_core(make_core(runner), prompts)
    assert_equal_to_reference(run, prompts, ref)
    assert run.stats is not None
    assert run.stats.prefix_cache_hits >= (len(prompts) - 1) * shared_blocks * BLOCK_SIZE
    cached = sorted(run.num_cached.values())
    assert cached[0] == 0  # the first one computed the prefix...
    assert all(c >= shared_blocks * BLOCK_SIZE for c in cached[1:])  # ...the others reused it
    return run


def check_chunked_prefill(
    runner: ModelRunner, ref: HFReference, long_prompt: list[int], short_prompt: list[int]
) -> EngineRun:
    """A prompt longer than the token budget is prefilled in chunks while a short request
    decodes beside it."""
    budget = 64
    assert len(long_prompt) > 4 * budget
    prompts = {"short": short_prompt, "long": long_prompt}
    run = run_core(make_core(runner, max_num_batched_tokens=budget), prompts)
    assert_equal_to_reference(run, prompts, ref)
    assert run.first_output_step["short"] == 1
    assert run.first_output_step["long"] >= -(-len(long_prompt) // budget)
    return run


def check_preemption(
    runner: ModelRunner, ref: HFReference, prompts: dict[str, list[int]]
) -> EngineRun:
    """KV blocks for exactly the prompts: every request must grow, so some are preempted
    (recomputed later) and the outputs still equal the reference."""
    num_blocks = sum(-(-len(p) // BLOCK_SIZE) for p in prompts.values())
    assert all(
        len(p) + MAX_TOKENS > -(-len(p) // BLOCK_SIZE) * BLOCK_SIZE for p in prompts.values()
    )
    core = make_core(BlockLimit(runner, num_blocks))
    run = run_core(core, prompts)
    assert run.stats is not None
    assert run.stats.num_preemptions > 0
    assert_equal_to_reference(run, prompts, ref)
    assert run.stats.num_free_blocks == num_blocks
    return run
