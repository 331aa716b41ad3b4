"""`kernel_ab.py`'s cases for the opt-in weight formats: the int8 GEMM (`MODELYARD_WEIGHTS=int8`)
and the GGUF-block GEMMs (`MODELYARD_WEIGHTS=gguf`, Q4_1 as the packaged model ships), over 30
layers' weights of each shape of the default model, at 32, 8 and 1 rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from modelyard.runner import kernels
from modelyard.runner.gguf_weights import Q4_1, Blocks, pack_gguf, pack_swiglu_gguf

LAYERS = 30
SHAPES = {"qkv": (960, 576), "o": (576, 576), "down": (576, 1536)}
INTERMEDIATE, HIDDEN = 1536, 576
Case = Callable[[Any], torch.Tensor]
Packs = list[tuple[torch.Tensor, torch.Tensor]]


def q4_1_blocks(n: int, k: int, rng: np.random.Generator) -> Blocks:
    """Random Q4_1 blocks (N, K / 32 x 20 bytes): float16 scale and min, then 16 bytes of
    nibbles, the scales of a trained model's size."""
    raw = rng.integers(0, 256, size=(n, k // 32, 20), dtype=np.uint8)
    scales = rng.random((n, k // 32, 2)) * np.array([0.02, -0.1]) + np.array([0.001, 0.0])
    raw[..., 0:4] = scales.astype(np.float16).view(np.uint8)
    return Blocks(Q4_1, raw.reshape(n, -1), k)


def int8_cases(rows: int) -> dict[str, Case]:
    """`packed_linear_int8` per shape (the gate/up pair as one weight)."""
    torch.manual_seed(5)
    cases: dict[str, Case] = {}
    for name, (n, k) in {**SHAPES, "gate_up": (2 * INTERMEDIATE, HIDDEN)}.items():
        packs = [kernels.pack_int8(torch.randn(n, k)) for _ in range(LAYERS)]
        x = torch.randn(rows, k)

        def run(ops: Any, n: int = n, x: torch.Tensor = x,
                packs: Packs = packs) -> torch.Tensor:  # fmt: skip
            return torch.stack([ops.packed_linear_int8(x, p, s, n, None) for p, s in packs])

        cases[f"gemm_int8_{name}_m{rows}"] = run
    return cases


def gguf_cases(rows: int) -> dict[str, Case]:
    """`packed_linear_gguf` per shape and `packed_swiglu_gguf` on the gate/up pair."""
    rng = np.random.default_rng(6)
    torch.manual_seed(6)
    cases: dict[str, Case] = {}
    for name, (n, k) in SHAPES.items():
        packs = [pack_gguf(q4_1_blocks(n, k, rng)) for _ in range(LAYERS)]
        x = torch.randn(rows, k)

        def run(ops: Any, n: int = n, x: torch.Tensor = x,
                packs: list[torch.Tensor] = packs) -> torch.Tensor:  # fmt: skip
            return torch.stack([ops.packed_linear_gguf(x, p, Q4_1, n, None) for p in packs])

        cases[f"gemm_gguf_{name}_m{rows}"] = run
    both = [
        pack_swiglu_gguf(*(q4_1_blocks(INTERMEDIATE, HIDDEN, rng) for _ in range(2)))
        for _ in range(LAYERS)
    ]
    x = torch.randn(rows, HIDDEN)

    def swiglu(ops: Any) -> torch.Tensor:
        return torch.stack([ops.packed_swiglu_gguf(x, p, Q4_1, INTERMEDIATE) for p in both])

    cases[f"gemm_gguf_swiglu_m{rows}"] = swiglu
    return cases


def quant_cases(builds: dict[str, Any]) -> dict[str, Case]:
    """Both formats' cases at 32, 8 and 1 rows, where every build has the kernels."""
    cases: dict[str, Case] = {}
    for rows in (32, 8, 1):
        if all(hasattr(b, "packed_linear_int8") for b in builds.values()):
            cases.update(int8_cases(rows))
        if all(hasattr(b, "packed_swiglu_gguf") for b in builds.values()):
            cases.update(gguf_cases(rows))
    return cases
