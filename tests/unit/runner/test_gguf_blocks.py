"""The GGUF block types as unpacked for the kernels (runner.gguf_blocks): every type's weights are
gguf's own float32 dequantization bit for bit, on random blocks and on gguf's own quantization."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from gguf_random import TYPES, random_blocks

from modelyard.runner.gguf_blocks import Blocks, dequantize_blocks, kind_of, pack_gguf

pytestmark = pytest.mark.unit


def reference(blocks: Blocks, name: str) -> torch.Tensor:
    return torch.from_numpy(np.array(quants.dequantize(blocks.raw, GGMLQuantizationType[name])))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)  # -0.0 and 0.0 differ


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_blocks_is_ggufs_bit_for_bit(name: str) -> None:
    blocks = random_blocks(name, 21, 512, seed=len(name) + ord(name[1]))
    got = dequantize_blocks(blocks)
    assert got.dtype == torch.float32
    assert got.shape == (21, 512)
    assert torch.equal(bits(got), bits(reference(blocks, name)))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_ggufs_own_quantization_too(name: str) -> None:
    weight = np.random.default_rng(1).standard_normal((9, 96)).astype(np.float32)
    raw = quants.quantize(weight, GGMLQuantizationType[name])
    kind = kind_of(name)
    assert kind is not None
    blocks = Blocks(kind, raw, 96)
    assert torch.equal(bits(dequantize_blocks(blocks)), bits(reference(blocks, name)))


def test_types_without_kernels_have_no_kind() -> None:
    assert [kind_of(t) is None for t in ("Q2_K", "Q3_K", "F16", "IQ4_XS")] == [True] * 4
    assert len({kind_of(t) for t in TYPES}) == len(TYPES)


@pytest.mark.parametrize(
    ("name", "bits_a_weight"),
    [("Q4_0", 5), ("Q4_1", 6), ("Q4_K", 4.75), ("Q5_K", 7), ("Q6_K", 6.625), ("Q8_0", 9)],
)
def test_panels_stay_small(name: str, bits_a_weight: float) -> None:
    packed = pack_gguf(random_blocks(name, 32, 256, seed=0))
    assert packed.numel() * 8 == bits_a_weight * 32 * 256
