"""Helpers for the LoRA tests (unit, integration and e2e): adapters made with `peft` on a saved
base model (non-zero B), `peft`'s merged model as the greedy reference, a tiny random Llama to
make adapters on, and malformed adapters (one thing wrong each). A module with a unique name
(`conftest` is ambiguous when several areas have one)."""

from __future__ import annotations

import json
import math
import shutil
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from modelyard.engine.messages import LoRARequest


@contextmanager
def peft_quiet() -> Iterator[None]:
    """peft reads `is_gradient_checkpointing`, which transformers 5 deprecates (FutureWarning)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        yield


def float_base(source: str, cache_dir: str) -> Path:
    """A float32 Hugging Face folder of model `source` (a GGUF file is kept in place by the
    server; peft needs a folder): the weights read through the server's own weight source
    (gguf's dequantization), saved once under `cache_dir`/test-float32/, with the tokenizer."""
    import hashlib
    import tempfile

    from modelyard.runner.loader import resolve_model, weight_source
    from modelyard.runner.models.hf_generic import model_from_source

    resolved = resolve_model(source, cache_dir)
    if resolved.gguf is None:
        return resolved.path
    digest = hashlib.sha256(str(resolved.path).encode()).hexdigest()[:12]
    target = Path(cache_dir).expanduser() / "test-float32" / f"{resolved.gguf.stem}-{digest}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent))
    model = model_from_source(
        resolved.path, weight_source(resolved, use_blocks=False), torch.float32
    )
    model.save_pretrained(tmp)
    for item in resolved.tokenizer_path.iterdir():
        if item.is_file() and not (tmp / item.name).exists():
            shutil.copy(item, tmp / item.name)
    try:
        tmp.rename(target)
    except OSError:  # another process saved it first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


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


def tiny_llama(folder: Path, *, hidden: int = 32, layers: int = 2) -> Path:
    """A tiny random Llama saved in `folder`: a base for adapters in tests without a real model
    (or, of another size, a base whose adapters fit no served model)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


#: the cases of `malformed_adapters`
MALFORMED = (
    "config-not-json",
    "config-a-list",
    "alpha-a-list",
    "alpha-pattern-a-list",
    "rslora-a-string",
    "dora",
    "safetensors-corrupt",
    "safetensors-truncated",
    "no-safetensors",
    "no-config",
    "no-folder",
    "nan-weights",
    "only-lora-a",
    "rank-too-large",
    "for-another-base",
    "unsupported-target-module",
)


def malformed_adapters(
    base: Path, good: Path, root: Path, *, other_base: Path
) -> dict[str, tuple[Path, str]]:
    """Broken adapters for `base` under `root`, most of them copies of `good` (an adapter of
    `base`, rank <= 8) with one thing wrong: case -> (folder, words its refusal must contain).
    `other_base` is a model of other shapes."""
    cases: dict[str, tuple[Path, str]] = {}

    def copy(case: str, words: str) -> Path:
        folder = root / case
        shutil.copytree(good, folder)
        cases[case] = (folder, words)
        return folder

    def config_text(case: str, words: str, text: str) -> None:
        (copy(case, words) / "adapter_config.json").write_text(text)

    def config_fields(case: str, words: str, **fields: Any) -> None:
        config = json.loads((good / "adapter_config.json").read_text())
        config_text(case, words, json.dumps({**config, **fields}))

    def tensors(case: str, words: str, change: Callable[[dict[str, torch.Tensor]], None]) -> None:
        folder = copy(case, words)
        weights = load_file(folder / "adapter_model.safetensors")
        change(weights)
        save_file(weights, folder / "adapter_model.safetensors")

    config_text("config-not-json", "adapter_config.json is not valid JSON", "{not json")
    config_text("config-a-list", "must hold a JSON object, not a list", "[1, 2]")
    config_fields("alpha-a-list", "lora_alpha must be a finite number", lora_alpha=[16])
    config_fields("alpha-pattern-a-list", "alpha_pattern must be", alpha_pattern=["q_proj"])
    config_fields("rslora-a-string", "use_rslora must be true or false", use_rslora="yes")
    config_fields("dora", "only plain LoRA", use_dora=True)
    raw = (good / "adapter_model.safetensors").read_bytes()
    corrupt = copy("safetensors-corrupt", "not a valid safetensors file")
    (corrupt / "adapter_model.safetensors").write_bytes(b"\x10\x00" + raw[2:])
    truncated = copy("safetensors-truncated", "not a valid safetensors file")
    (truncated / "adapter_model.safetensors").write_bytes(raw[: len(raw) // 2])
    (copy("no-safetensors", "no adapter_model.safetensors") / "adapter_model.safetensors").unlink()
    (copy("no-config", "no adapter_config.json") / "adapter_config.json").unlink()
    cases["no-folder"] = (root / "nothing-here", "no PEFT LoRA folder")
    tensors("nan-weights", "NaN or infinite", lambda w: next(iter(w.values())).fill_(math.nan))
    tensors("only-lora-a", "needs both lora_A and lora_B", _drop_a_lora_b)
    tensors("rank-too-large", "max_lora_rank", _pad_rank)
    cases["for-another-base"] = (
        make_adapter(other_base, root / "for-another-base", seed=5, rank=4),
        "does not fit the base",
    )
    with warnings.catch_warnings():  # peft warns of the (maybe tied) output layer it targets
        lm_head_warnings = "Setting `save_embedding_layers`|Model has `tie_word_embeddings"
        warnings.filterwarnings("ignore", lm_head_warnings, UserWarning)
        lm_head = make_adapter(base, root / "lm-head", seed=6, rank=4, target_modules=["lm_head"])
    cases["unsupported-target-module"] = (lm_head, "unsupported target module 'lm_head'")
    assert tuple(cases) == MALFORMED
    return cases


def _drop_a_lora_b(weights: dict[str, torch.Tensor]) -> None:
    del weights[next(k for k in weights if "lora_B" in k)]


def _pad_rank(weights: dict[str, torch.Tensor]) -> None:
    """Every A (r, in) and B (out, r) zero-padded to r = 32."""
    for key, value in weights.items():
        pad = (0, 0, 0, 32 - value.shape[0]) if "lora_A" in key else (0, 32 - value.shape[1])
        weights[key] = torch.nn.functional.pad(value, pad).contiguous()
