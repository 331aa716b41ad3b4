"""A model's weights by their Hugging Face names, wherever the file keeps them.

The native models (runner.models) never open files themselves: they ask a `WeightSource` for
each weight by its transformers checkpoint name ("model.layers.3.self_attn.q_proj.weight").
`SafetensorsSource` reads a Hugging Face folder lazily, one tensor at a time (no dict of the whole
model in memory); the GGUF source (runner.gguf_source) maps the names onto the file's tensors,
memory-mapped, and offers a 2-D weight's quantized blocks (`blocks`) so that a linear layer can
run on them (runner.gguf_weights) instead of a float copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch
from safetensors import safe_open

from modelyard.runner.gguf_weights import Blocks


class WeightSource(Protocol):
    """Weights by Hugging Face checkpoint name."""

    def names(self) -> frozenset[str]:
        """Every weight name the source holds."""
        ...

    def tensor(self, name: str) -> torch.Tensor:
        """The weight as a float tensor (its file dtype, or float32 when the file quantizes it);
        KeyError when absent."""
        ...

    def blocks(self, name: str) -> Blocks | None:
        """A 2-D weight's quantized blocks in transformers' row order, or None when the source
        holds it as float (or in a block type without kernels)."""
        ...

    def release(self) -> None:
        """The model has taken what it keeps: pages the load read may leave the process'
        resident set (blocks stay valid; a later read faults them back in)."""
        ...


class SafetensorsSource:
    """The *.safetensors files of a Hugging Face folder, read one tensor at a time."""

    def __init__(self, folder: Path) -> None:
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ValueError(f"no *.safetensors files in {folder}")
        self._where: dict[str, Path] = {}
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    self._where[name] = file

    def names(self) -> frozenset[str]:
        return frozenset(self._where)

    def tensor(self, name: str) -> torch.Tensor:
        with safe_open(str(self._where[name]), framework="pt") as handle:
            out: torch.Tensor = handle.get_tensor(name)
        return out

    def blocks(self, name: str) -> Blocks | None:
        return None

    def release(self) -> None:
        return None  # nothing is mapped between reads


def optional(source: WeightSource, name: str) -> torch.Tensor | None:
    """`source.tensor(name)`, or None when the source has no such weight."""
    return source.tensor(name) if name in source.names() else None
