"""Helpers for engine integration tests (a module with a unique name: `conftest` is ambiguous
when several areas have one)."""

from __future__ import annotations

from pathlib import Path

from modelyard.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig


def engine_config(model_dir: Path, num_blocks: int = 64) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(model=str(model_dir), max_model_len=256, num_threads=1),
        cache=CacheConfig(num_blocks=num_blocks, block_size=16),
        scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=256),
    )


def hf_greedy(model_dir: Path, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy generate, stopping at EOS like the engine does."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
        )
    return [int(t) for t in out[0, len(prompt_ids) :]]
