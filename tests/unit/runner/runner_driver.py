"""Helpers for the runner tests: tiny random model configs and a minimal step driver that
plays the scheduler's part: it allocates block ids itself, splits prefills into chunks,
shares leading blocks between requests and restarts requests at position 0."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from modelyard.engine.config import CacheConfig, ModelConfig, kernels_from_environment
from modelyard.engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from modelyard.engine.sampling_params import SamplingParams
from modelyard.runner.model_runner import ModelRunner

KERNELS = kernels_from_environment()  # the switches of this test run's environment

BLOCK_SIZE = 4
VOCAB = 96


def tiny_configs() -> dict[str, object]:
    from transformers import GPT2Config, LlamaConfig, OPTConfig, Qwen2Config

    common = {"vocab_size": VOCAB, "initializer_range": 0.3, "eos_token_id": 2, "bos_token_id": 1}
    return {
        "llama": LlamaConfig(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            rope_theta=5000.0,
            tie_word_embeddings=False,
            **common,
        ),
        "llama_tied": LlamaConfig(
            hidden_size=48,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=3,
            num_key_value_heads=1,
            max_position_embeddings=256,
            tie_word_embeddings=True,
            **common,
        ),
        "qwen2": Qwen2Config(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            tie_word_embeddings=False,
            **common,
        ),
        "gpt2": GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=256, **common),
        "opt": OPTConfig(
            hidden_size=64,
            ffn_dim=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=256,
            word_embed_proj_dim=64,
            pad_token_id=0,
            **common,
        ),
    }


def make_runner(
    folder: Path, *, dtype: str = "float32", implementation: str = "auto"
) -> ModelRunner:
    return ModelRunner(
        ModelConfig(model=str(folder), dtype=dtype, implementation=implementation),  # type: ignore[arg-type]
        CacheConfig(block_size=BLOCK_SIZE, num_blocks=512),
        kernels=KERNELS,
    )


@dataclass
class DriverRequest:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    output: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose KV is in the cache
    block_table: list[int] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_tokens


class Driver:
    """A stand-in scheduler: every active request runs each step, prefills in chunks."""

    def __init__(self, runner: ModelRunner, chunk: int = 1_000_000) -> None:
        self.runner = runner
        self.chunk = chunk  # most prefill tokens per request per step
        self.next_block = 1  # block 0 is never handed out, so padding rows stay unused
        self.requests: dict[str, DriverRequest] = {}
        self.finished: set[str] = set()

    def add(
        self,
        rid: str,
        prompt: list[int],
        max_tokens: int,
        params: SamplingParams | None = None,
        shared_from: str | None = None,
        shared_blocks: int = 0,
    ) -> DriverRequest:
        """Add a request; with shared_from, reuse that request's first `shared_blocks` blocks."""
        req = DriverRequest(rid, prompt, params or SamplingParams(temperature=0.0), max_tokens)
        if shared_from is not None:
            req.block_table = self.requests[shared_from].block_table[:shared_blocks]
            req.num_computed = shared_blocks * BLOCK_SIZE
        self.requests[rid] = req
        return req

    def preempt(self, rid: str) -> None:
        """Recompute from scratch into fresh blocks (the old ones are simply abandoned)."""
        req = self.requests[rid]
        req.num_computed = 0
        req.block_table = []

    def _schedule(self, req: DriverRequest) -> ScheduledRequest:
        known = req.prompt + req.output
        n = min(len(known) - req.num_computed, self.chunk)
        need = (req.num_computed + n + BLOCK_SIZE - 1) // BLOCK_SIZE
        while len(req.block_table) < need:
            req.block_table.append(self.next_block)
            self.next_block += 1
        return ScheduledRequest(
            request_id=req.request_id,
            token_ids=known[req.num_computed : req.num_computed + n],
            start_position=req.num_computed,
            block_table=list(req.block_table),
            sample=req.num_computed + n == len(known),
            sampling_params=req.params,
            prompt_token_ids=req.prompt,
            output_token_ids=req.output,
        )

    def step(self) -> None:
        active = [r for r in self.requests.values() if not r.done]
        scheduled = [self._schedule(r) for r in active]
        out = self.runner.execute(
            SchedulerOutput(
                scheduled=scheduled,
                num_batched_tokens=sum(len(s.token_ids) for s in scheduled),
                finished_request_ids=set(self.finished),
            )
        )
        self.finished.clear()
        for req, sched in zip(active, scheduled, strict=True):
            req.num_computed += len(sched.token_ids)
            if sched.sample:
                req.output.append(out.sampled_token_ids[req.request_id])
                if req.done:
                    self.finished.add(req.request_id)

    def run(self) -> dict[str, list[int]]:
        while any(not r.done for r in self.requests.values()):
            self.step()
        return {rid: r.output for rid, r in self.requests.items()}


def hf_greedy(folder: Path, prompt: list[int], max_tokens: int) -> list[int]:
    """transformers generate(do_sample=False), the reference (stops early at EOS)."""
    model = _hf_model(folder)
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return list(out[0, len(prompt) :].tolist())


_HF_CACHE: dict[Path, object] = {}


def _hf_model(folder: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    if folder not in _HF_CACHE:
        _HF_CACHE[folder] = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return _HF_CACHE[folder]


def assert_matches_reference(ours: list[int], reference: list[int]) -> None:
    """Equal token for token; the reference may stop early at EOS (then it ends with EOS)."""
    assert ours[: len(reference)] == reference
