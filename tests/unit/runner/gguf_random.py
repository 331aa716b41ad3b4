"""Random valid GGUF blocks of every kernel type, for the gguf_blocks / gguf_weights tests: random
bytes where every float16 field (d, dmin, m) is a finite number around `scale`."""

from __future__ import annotations

import numpy as np

from modelyard.runner.gguf_blocks import Blocks, kind_of

# type -> (weights a block, bytes a block, offsets of its float16 fields)
LAYOUTS = {
    "Q4_0": (32, 18, (0,)),
    "Q4_1": (32, 20, (0, 2)),
    "Q5_0": (32, 22, (0,)),
    "Q5_1": (32, 24, (0, 2)),
    "Q8_0": (32, 34, (0,)),
    "Q4_K": (256, 144, (0, 2)),
    "Q5_K": (256, 176, (0, 2)),
    "Q6_K": (256, 210, (208,)),
}
TYPES = tuple(LAYOUTS)


def random_blocks(name: str, n: int, k: int, seed: int, scale: float = 0.01) -> Blocks:
    """(n, k) weights of GGUF type `name` as random blocks."""
    per, size, halves = LAYOUTS[name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, k // per, size), dtype=np.uint8)
    for at in halves:
        d = (rng.standard_normal((n, k // per, 1)) * scale).astype(np.float16)
        raw[..., at : at + 2] = d.view(np.uint8)
    kind = kind_of(name)
    assert kind is not None
    return Blocks(kind, raw.reshape(n, -1), k)
