"""GGUFSource round trips: a tiny random checkpoint per architecture, written as llama.cpp's
converter writes it (tests/unit/runner/tiny_gguf.py), comes back under its HF names with its
exact values, and the config derived from the metadata has the checkpoint's fields.
References: gguf-py (GGUFReader, quantize / dequantize) and transformers' GGUF loader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, quants
from tiny_gguf import SPECS, checkpoint, gguf_tensors, write

from modelyard.runner.gguf_config import gguf_config
from modelyard.runner.gguf_file import GGUFFile
from modelyard.runner.gguf_source import GGUFSource
from modelyard.runner.gguf_weights import Q4_1, Q8_0, kind_of, unpermute_rows

pytestmark = pytest.mark.unit

CONFIG_FIELDS = [
    "model_type", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "vocab_size", "num_hidden_layers", "max_position_embeddings",
]  # fmt: skip


def expected(arch: str, name: str, value: torch.Tensor) -> torch.Tensor:
    """What a float32 weight reads back as: Gemma norms went through +1 and -1."""
    return (value + 1) - 1 if arch.startswith("gemma") and name.endswith("norm.weight") else value


@pytest.mark.parametrize("key", sorted(SPECS))
def test_round_trip_names_tensors_and_config(key: str, tmp_path: Path) -> None:
    spec = SPECS[key]
    state = checkpoint(spec)
    path = write(spec, gguf_tensors(spec, state), tmp_path / f"{key}.gguf", {})
    file = GGUFFile(path)
    config = gguf_config(file)
    for field in CONFIG_FIELDS:
        assert getattr(config, field) == spec.config[field], field
    assert config.rms_norm_eps == pytest.approx(spec.config["rms_norm_eps"])
    assert config.tie_word_embeddings == spec.tied
    for field in ("num_local_experts", "num_experts", "num_experts_per_tok"):
        if field in spec.config:
            assert getattr(config, field) == spec.config[field]
    source = GGUFSource(path, config, use_blocks=True)
    assert source.names() == frozenset(state)
    for name, value in state.items():
        assert torch.equal(source.tensor(name), expected(spec.arch, name, value)), name
        assert source.blocks(name) is None  # float32 in the file


def test_gemma3_config_has_what_transformers_mapping_leaves_out(tmp_path: Path) -> None:
    spec = SPECS["gemma3"]
    path = write(spec, gguf_tensors(spec, checkpoint(spec)), tmp_path / "g.gguf", {})
    config = gguf_config(GGUFFile(path))
    assert config.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    assert config.sliding_window == 16
    assert config.query_pre_attn_scalar == 8  # head_dim
    assert config.rope_parameters["sliding_attention"]["rope_theta"] == 10_000.0
    assert config.rope_parameters["full_attention"]["rope_theta"] == 10_000.0  # the file's


def test_gemma2_layers_alternate_sliding_and_global(tmp_path: Path) -> None:
    spec = SPECS["gemma2"]
    path = write(spec, gguf_tensors(spec, checkpoint(spec)), tmp_path / "g2.gguf", {})
    config = gguf_config(GGUFFile(path))
    assert config.layer_types == ["sliding_attention", "full_attention"]
    assert (config.sliding_window, config.query_pre_attn_scalar) == (16, 8)


@pytest.mark.parametrize("key", ["llama", "gemma2", "gemma3"])
def test_tensors_equal_transformers_gguf_loader(key: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    spec = SPECS[key]
    path = write(spec, gguf_tensors(spec, checkpoint(spec)), tmp_path / f"{key}.gguf", {})
    config = gguf_config(GGUFFile(path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    theirs = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    source = GGUFSource(path, config, use_blocks=False)
    assert set(theirs) == set(source.names())
    for name, tensor in theirs.items():
        assert torch.equal(source.tensor(name), tensor.float()), name


def test_quantized_weights_dequantize_and_offer_blocks_in_hf_row_order(tmp_path: Path) -> None:
    spec = SPECS["llama"]
    state = checkpoint(spec)
    tensors = gguf_tensors(spec, state)
    types = {
        "blk.0.attn_q.weight": GGMLQuantizationType.Q8_0,
        "blk.0.ffn_up.weight": GGMLQuantizationType.Q4_1,
        "blk.0.ffn_down.weight": GGMLQuantizationType.Q4_0,
    }
    path = write(spec, tensors, tmp_path / "q.gguf", types)
    config = gguf_config(GGUFFile(path))
    source = GGUFSource(path, config, use_blocks=True)
    q, up = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"
    # the reference: quantize what the converter wrote, dequantize, undo the permutation
    q_ref = quants.dequantize(
        quants.quantize(tensors["blk.0.attn_q.weight"], types["blk.0.attn_q.weight"]),
        types["blk.0.attn_q.weight"],
    )
    assert torch.equal(source.tensor(q), torch.from_numpy(q_ref[unpermute_rows(q_ref.shape[0], 4)]))
    blocks = source.blocks(q)
    assert blocks is not None
    assert (blocks.kind, blocks.k) == (Q8_0, 32)
    assert torch.equal(
        torch.from_numpy(quants.dequantize(blocks.raw, GGMLQuantizationType.Q8_0)), source.tensor(q)
    )
    up_blocks = source.blocks(up)
    assert up_blocks is not None
    assert up_blocks.kind == Q4_1
    assert np.shares_memory(
        up_blocks.raw, source.file.tensors["blk.0.ffn_up.weight"].data
    )  # no copy
    down_blocks = source.blocks("model.layers.0.mlp.down_proj.weight")
    assert down_blocks is not None
    assert down_blocks.kind == kind_of("Q4_0")
    assert source.blocks("model.layers.0.input_layernorm.weight") is None  # float32
    assert GGUFSource(path, config, use_blocks=False).blocks(up) is None


def test_header_reader_agrees_with_gguf_reader(tmp_path: Path) -> None:
    spec = SPECS["qwen3moe"]
    tensors = gguf_tensors(spec, checkpoint(spec))
    path = write(
        spec,
        tensors,
        tmp_path / "m.gguf",
        {"blk.1.ffn_gate_exps.weight": GGMLQuantizationType.Q8_0},
    )
    ours, theirs = GGUFFile(path), GGUFReader(str(path))
    assert set(ours.tensors) == {t.name for t in theirs.tensors}
    for t in theirs.tensors:
        mine = ours.tensors[t.name]
        assert (mine.type, mine.ne) == (t.tensor_type, tuple(int(n) for n in t.shape))
        assert mine.data.dtype == t.data.dtype
        assert np.array_equal(mine.data, t.data)
    for key, field in theirs.fields.items():
        if not key.startswith("GGUF."):
            assert ours.metadata[key] == pytest.approx(field.contents()), key


def test_generic_model_from_a_gguf_source_is_the_checkpoints_model(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from modelyard.runner.models.hf_generic import model_from_source

    spec = SPECS["qwen3"]
    state = checkpoint(spec)
    path = write(spec, gguf_tensors(spec, state), tmp_path / "q.gguf", {})
    config = gguf_config(GGUFFile(path))
    config.save_pretrained(tmp_path / "folder")
    ours = model_from_source(
        tmp_path / "folder", GGUFSource(path, config, use_blocks=False), torch.float32
    )
    reference = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    reference.load_state_dict(state, strict=False)
    reference.tie_weights()
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    with torch.inference_mode():
        assert torch.equal(ours(ids).logits, reference(ids).logits)
