"""The native decoder's families against transformers, on tiny random models.

For each family (Llama 3 rope untied, Qwen3, Gemma 3, Phi-3 longrope with partial rotary) in
float32 and bfloat16: the model is built by transformers from a tiny config with a fixed seed
(initializer_range 0.2 and norm weights jittered, so that bf16 argmaxes are decisive), saved,
and loaded into our decoder and engine.
- the logits of every position of a prompt match transformers' forward in the same dtype;
- greedy tokens equal `generate(do_sample=False)` for 3 prompts of different lengths, each run
  alone and then all batched with a repeated prompt, through an engine with chunked prefill
  (16-token budget), prefix caching and n-gram speculation on, and KV blocks for about one
  request at a time, so that the batch is preempted and recomputed.
Gemma 3's and the windowed Phi-3's prompts are longer than their sliding windows (8, 6).
Qwen3-MoE and Mixtral run the same tests (runner.models.moe).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from lora_helpers import MergedReference, lora_request, make_adapter
from modelyard.engine.config import kernels_from_environment
from modelyard.engine.llm import LLM
from modelyard.engine.sampling_params import SamplingParams
from modelyard.runner.attention import AttentionMetadata
from modelyard.runner.models.arch import native_supports
from modelyard.runner.models.decoder import DecoderModel
from modelyard.runner.weights import SafetensorsSource

pytestmark = pytest.mark.integration

KERNELS = kernels_from_environment()
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
NEW_TOKENS = 8
BLOCK = 4
COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "initializer_range": 0.2,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": 0,
}


def _llama3(vocab: int) -> Any:
    from transformers import LlamaConfig

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0}
    rope |= {
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    }
    return LlamaConfig(
        vocab_size=vocab, num_hidden_layers=2, rope_parameters=rope, tie_word_embeddings=False,
        **COMMON,
    )  # fmt: skip


def _qwen3(vocab: int) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab, num_hidden_layers=2, head_dim=32, tie_word_embeddings=True, **COMMON
    )


def _gemma3(vocab: int) -> Any:
    from transformers import Gemma3TextConfig

    rope = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
    }
    layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    common = COMMON | {"num_attention_heads": 2, "num_key_value_heads": 1}
    return Gemma3TextConfig(
        vocab_size=vocab, num_hidden_layers=3, head_dim=256, query_pre_attn_scalar=32,
        sliding_window=8, layer_types=layer_types, rope_parameters=rope,
        final_logit_softcapping=30.0, **common,
    )  # fmt: skip


def _phi3(vocab: int) -> Any:
    from transformers import Phi3Config

    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}
    rope |= {"short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5], "original_max_position_embeddings": 48}
    rope["long_factor"] = [1.0, 1.5, 2.5, 4.0, 6.0, 9.0]
    return Phi3Config(
        vocab_size=vocab, num_hidden_layers=2, partial_rotary_factor=0.75, rope_parameters=rope,
        original_max_position_embeddings=48, tie_word_embeddings=False,
        **(COMMON | {"max_position_embeddings": 192}),
    )  # fmt: skip


def _phi3_window(vocab: int) -> Any:
    """Phi-3-mini-like: full rotary, default rope and one sliding window for every layer (the
    fused kernels' path, fed by the fused checkpoint weights)."""
    from transformers import Phi3Config

    return Phi3Config(
        vocab_size=vocab, num_hidden_layers=2, sliding_window=6, tie_word_embeddings=False,
        **COMMON,
    )  # fmt: skip


def _qwen3_moe(vocab: int) -> Any:
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=vocab, num_hidden_layers=2, head_dim=32, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=64, **COMMON,
    )  # fmt: skip


def _mixtral(vocab: int) -> Any:
    from transformers import MixtralConfig

    return MixtralConfig(
        vocab_size=vocab, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
        **COMMON,
    )  # fmt: skip


FAMILIES: list[Any] = [
    pytest.param(_llama3, id="llama3"),
    pytest.param(_qwen3, id="qwen3"),
    pytest.param(_gemma3, id="gemma3"),
    pytest.param(_phi3, id="phi3"),
    pytest.param(_phi3_window, id="phi3_window"),
    pytest.param(_qwen3_moe, id="qwen3_moe"),
    pytest.param(_mixtral, id="mixtral"),
]


@pytest.fixture(scope="module", params=FAMILIES)
def model_dir(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path
) -> Path:
    return _saved(request.param, tmp_path_factory, tiny_llama_dir)


def _saved(
    make: Callable[[int], Any], tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path
) -> Path:
    """A tiny random model of the family with the tiny Llama's tokenizer, saved."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = make(len(tokenizer))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.2)
    folder = tmp_path_factory.mktemp(make.__name__.strip("_"))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert native_supports(config.architectures[0], config)
    return folder


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (5, 13, 27)]


def _hf(folder: Path, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


@pytest.mark.parametrize("dtype", DTYPES)
def test_logits_match_transformers(model_dir: Path, dtype: str) -> None:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    hf = _hf(model_dir, DTYPES[dtype])
    ids = _prompts(config.vocab_size)[2][:20]
    with torch.inference_mode():
        expected = hf(torch.tensor([ids])).logits[0].float()  # (T, V)
        model = DecoderModel(
            SafetensorsSource(model_dir), config.architectures[0], config, dtype=DTYPES[dtype],
            num_blocks=8, block_size=BLOCK, max_model_len=64, kernel_config=KERNELS,
        )  # fmt: skip
        meta = AttentionMetadata.build(
            [0], [len(ids)], [list(range(5))], BLOCK, model.sliding_window
        )
        got = model.forward(torch.tensor(ids), meta, torch.arange(len(ids))).float()
    scale = float(expected.abs().max())
    tol = 1e-4 if dtype == "float32" else 2e-2
    torch.testing.assert_close(got, expected, atol=tol * scale, rtol=0)
    if dtype == "float32":  # (bf16 argmaxes: the greedy test, on decisive steps)
        assert torch.equal(got.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_equals_transformers_alone_and_batched(model_dir: Path, dtype: str) -> None:
    hf = _hf(model_dir, DTYPES[dtype])
    prompts = _prompts(hf.config.vocab_size)
    with torch.inference_mode():
        expected = [
            hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)[
                0, len(p) :
            ].tolist()
            for p in prompts
        ]
    llm = LLM(
        str(model_dir), dtype=dtype, max_model_len=128, num_threads=1, num_blocks=16,
        block_size=BLOCK, max_num_batched_tokens=16,
        speculative={"method": "ngram", "prompt_lookup_min": 1, "long_output_tokens": 0},
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    alone = [llm.generate([p], params)[0].token_ids for p in prompts]
    batched = [r.token_ids for r in llm.generate([*prompts, prompts[1]], params)]
    assert alone == expected
    assert batched == [*expected, expected[1]]
    assert llm.stats().num_preemptions > 0  # 16 blocks of 4 tokens hold one request at a time


def test_lora_on_qwen3_equals_peft_merged(
    tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path
) -> None:
    """Qwen3's q/k norms come after the adapters' q/k deltas, as in peft."""
    base = _saved(_qwen3, tmp_path_factory, tiny_llama_dir)
    adapter = make_adapter(base, tmp_path_factory.mktemp("qwen3-lora"), seed=3, rank=4)
    llm = LLM(str(base), max_model_len=128, num_threads=1, num_blocks=64, lora={"max_loras": 2})
    prompts = _prompts(llm.runner.vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    results = llm.generate(prompts, params, lora=lora_request("a", adapter, 1))
    ref = MergedReference(base)
    assert [r.token_ids for r in results] == [ref.greedy(adapter, p, NEW_TOKENS) for p in prompts]


@pytest.mark.parametrize("make", [_gemma3, _phi3], ids=["gemma3", "phi3"])
def test_lora_refused_where_the_hooks_do_not_fit(
    make: Callable[[int], Any], tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path
) -> None:
    """GeGLU and fused checkpoint weights have no LoRA hooks: refused at load."""
    folder = _saved(make, tmp_path_factory, tiny_llama_dir)
    with pytest.raises(ValueError, match="LoRA adapters are not supported"):
        LLM(str(folder), max_model_len=128, num_threads=1, num_blocks=8, lora={})
