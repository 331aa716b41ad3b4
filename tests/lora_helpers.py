"""Helpers for the LoRA tests (integration and e2e): adapters made with `peft` on a saved base
model (non-zero B), and `peft`'s merged model as the greedy reference. A module with a unique
name (`conftest` is ambiguous when several areas have one)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from modelyard.engine.messages import LoRARequest


@contextmanager
def peft_quiet() -> Iterator[None]:
    """peft reads `is_gradient_checkpointing`, which transformers 5 deprecates (FutureWarning)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        yield


ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(
    base: Path, folder: Path, *, seed: int, rank: int, std: float = 0.05, **config: Any
) -> Path:
    """A PEFT LoRA adapter on `base`, saved in `folder`: A and B random (B is zero in a freshly
    initialised adapter, which would change nothing), scaled by `std`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config.setdefault("target_modules", ALL_MODULES)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with peft_quiet():
        peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, **config))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * std)
    peft_model.save_pretrained(folder)
    return folder


class MergedReference:
    """`peft`'s merged model (W + s B A) per adapter, greedy `generate`, memoized."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._models: dict[str | None, Any] = {}

    def model(self, adapter: Path | None) -> Any:
        key = None if adapter is None else str(adapter)
        if key not in self._models:
            from peft import PeftModel
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(self.base, dtype=torch.float32)
            if adapter is not None:
                with peft_quiet():
                    model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
            self._models[key] = model.eval()
        return self._models[key]

    def greedy(self, adapter: Path | None, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
        ids = torch.tensor([list(prompt)])
        with torch.inference_mode():
            out = self.model(adapter).generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
            )
        return [int(t) for t in out[0, len(prompt) :]]

    def forced_argmax(
        self, adapter: Path | None, prompt: Sequence[int], tokens: Sequence[int]
    ) -> list[int]:
        """The merged model's argmax after prompt + tokens[:i] for every i (one forward): equal
        to `tokens` exactly when greedy generate would produce them."""
        ids = torch.tensor([[*prompt, *tokens[:-1]]])
        with torch.inference_mode():
            logits = self.model(adapter)(ids, logits_to_keep=len(tokens)).logits[0]
        return [int(t) for t in logits.argmax(-1)]


def lora_request(name: str, path: Path, adapter_id: int) -> LoRARequest:
    return LoRARequest(name=name, path=str(path), adapter_id=adapter_id)
