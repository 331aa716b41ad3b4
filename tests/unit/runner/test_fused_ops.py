"""The compiled element-wise ops (runner.kernels / csrc/fused_ops.cpp) against the torch ops
they replace, and a whole float32 forward with and without them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from modelyard.runner import kernels
from modelyard.runner.attention import AttentionMetadata
from modelyard.runner.models import llama

TOL = {"atol": 2e-6, "rtol": 2e-6}


@pytest.fixture(autouse=True)
def _built() -> None:
    assert kernels.load(), "the native kernels did not build (see scripts/setup)"


@pytest.mark.parametrize("rows", [1, 5, 300])  # 300 rows split across threads
def test_rms_norm_and_add_rms_norm_match_torch(rows: int) -> None:
    torch.manual_seed(0)
    x, delta, w = torch.randn(rows, 72) * 3, torch.randn(rows, 72), torch.randn(72)
    torch.testing.assert_close(kernels.rms_norm(x, w, 1e-5), llama._rms_norm(x, w, 1e-5), **TOL)
    residual = x.clone()
    normed = kernels.add_rms_norm(residual, delta, w, 1e-6)
    torch.testing.assert_close(residual, x + delta, atol=0, rtol=0)  # updated in place
    torch.testing.assert_close(normed, llama._rms_norm(x + delta, w, 1e-6), **TOL)


def test_rope_store_rotates_in_place_and_writes_the_cache() -> None:
    torch.manual_seed(2)
    nh, nkv, hd, bs, num_blocks = 6, 2, 16, 4, 5
    config = type("Config", (), {"rope_parameters": {"rope_theta": 10000.0}})()
    cos, sin = llama._rotary_tables(config, hd, torch.float32, 64)
    positions = torch.tensor([0, 7, 63])
    slots = torch.tensor([3, 17, 9])
    qkv = torch.randn(3, (nh + 2 * nkv) * hd)
    k_cache, v_cache = torch.zeros(nkv, num_blocks, bs, hd), torch.zeros(nkv, num_blocks, bs, hd)
    heads = qkv.view(3, nh + 2 * nkv, hd)
    expected_qk = llama._rope(heads[:, : nh + nkv], cos[positions, None], sin[positions, None])
    expected_v = heads[:, nh + nkv :].clone()
    kernels.rope_store(qkv, cos, sin, positions, k_cache, v_cache, slots, nh)
    torch.testing.assert_close(heads[:, : nh + nkv], expected_qk, **TOL)
    flat_k, flat_v = k_cache.view(nkv, -1, hd), v_cache.view(nkv, -1, hd)
    torch.testing.assert_close(flat_k[:, slots].transpose(0, 1), expected_qk[:, nh:], **TOL)
    torch.testing.assert_close(flat_v[:, slots].transpose(0, 1), expected_v, atol=0, rtol=0)
    untouched = torch.ones(nkv * num_blocks * bs, dtype=torch.bool).view(nkv, -1)
    untouched[:, slots] = False
    assert not flat_k[untouched].any()
    assert not flat_v[untouched].any()


def test_rope_store_rejects_a_slot_outside_the_cache() -> None:
    qkv = torch.randn(1, 4 * 8)
    cos = sin = torch.ones(4, 8)
    cache = torch.zeros(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="slot out of range"):
        kernels.rope_store(qkv, cos, sin, torch.tensor([1]), cache, cache.clone(),
                           torch.tensor([8]), 2)  # fmt: skip


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_fused_forward_matches_the_torch_forward(tiny_models: dict[str, Path], name: str) -> None:
    """A prefill step then a decode step, float32: logits of both paths agree."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_models[name])
    models = []
    for fused in (True, False):
        model = llama.LlamaModel(
            tiny_models[name], config, dtype=torch.float32, num_blocks=8, block_size=4,
            max_model_len=64,
        )  # fmt: skip
        model.fused = fused
        models.append(model)
    assert models[0].fused != models[1].fused
    prompt = torch.tensor([5, 9, 2, 33, 8, 1, 7])
    table = [3, 1]
    steps = [
        (prompt, AttentionMetadata.build([0], [7], [table], 4), torch.tensor([6])),
        (torch.tensor([11]), AttentionMetadata.build([7], [1], [table], 4), torch.tensor([0])),
    ]
    with torch.inference_mode():
        for ids, meta, rows in steps:
            fused_logits, torch_logits = (m.forward(ids, meta, rows) for m in models)
            torch.testing.assert_close(fused_logits, torch_logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("width", [1, 7, 8, 49152, 49157])  # vector body and scalar tail
def test_argmax_rows_matches_torch_with_ties_nan_and_inf(width: int) -> None:
    torch.manual_seed(3)
    x = torch.randn(6, width)
    x[1] = 0.5  # all equal: the first index
    x[2, -1] = float("inf")  # the maximum in the tail
    x[3] = float("-inf")  # nothing finite
    x[4, width // 2] = float("nan")  # NaN counts as the maximum, as in torch
    x[5, :: max(1, width // 3)] = 9.0  # ties: the first of them
    expected = x.argmax(dim=-1)
    torch.testing.assert_close(kernels.argmax_rows(x), expected, atol=0, rtol=0)
