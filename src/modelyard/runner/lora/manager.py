"""LoRA adapters on a loaded base model: per-row deltas inside the step, weights never merged.

A PEFT adapter adds, to a projection y = W x, the delta s * B (A x) with A (r, in), B (out, r)
and s = alpha / r (alpha / sqrt(r) with use_rslora; rank_pattern and alpha_pattern honoured).
Here, for every layer and projection group of the native Llama forward (qkv, o, gate_up, down;
a group's n modules share their input x):

- `max_loras` slots (S) of R ranks (`max_lora_rank` rounded up to 16) per group: a (S, in, n * R)
  holds each slot's A matrices transposed (module i at columns i * R, zero padded), bt
  (S, R, out) its scaled B matrices transposed (module i at its own output columns). A slot is
  written in place when an adapter takes it (zeroed first), so nothing is re-laid out when
  adapters come and go;
- per step, each row's slot (-1: the base model). Row t of slot s gets u = x[t] a[s] and then
  y[t] += u bt[s] module by module: each slot's matrices are read once for all its rows
  (grouped by slot, weights never merged), base rows get exactly nothing. In float32 with the
  compiled kernels this is csrc/lora.cpp (its work split like the GEMMs', inside the step's
  thread team); otherwise torch ops per slot;
- `LoRAManager` holds the adapters loaded from disk (read and checked by runner.lora.adapter;
  least recently used dropped past `max_cpu_loras` or `max_cpu_lora_bytes`) and which one
  sits in which slot (a step's adapters get slots, evicting the least recently used adapters
  the step does not need). The scheduler admits at most `max_loras` different adapters among
  running requests, so a step always fits. The stacks are allocated with the model (their size
  is the price of LoRA capacity), so taking a slot only copies an adapter's matrices.

The hooks (runner.lora.hooks: `LoRAProjection`, `LoRAGatedMLP`) wrap a layer's projections
in runner.models.layers; in a step without adapters (or on a layer no adapter targets) they run
exactly the base model's kernels. With adapters, the float32 MLP runs gate/up as one GEMM on
the fused SwiGLU's own packed weight, and csrc/lora.cpp adds the deltas and applies the
activation in one pass.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from modelyard.engine.config import LoRAConfig
from modelyard.engine.messages import LoRARequest
from modelyard.runner import kernels
from modelyard.runner.lora.adapter import Adapter, BaseShapes, read_adapter

#: projection group -> (PEFT module names in output order)
GROUPS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}
_MODULE_GROUP = {m: g for g, modules in GROUPS.items() for m in modules}


class _GroupStacks:
    """One layer's group: a (S, in, n * R), bt (S, R, out) and the modules' column bounds."""

    __slots__ = ("a", "bounds", "bt")

    def __init__(self, a: torch.Tensor, bt: torch.Tensor, bounds: list[int]) -> None:
        self.a = a
        self.bt = bt
        self.bounds = bounds  # module i's output columns: bounds[i] .. bounds[i + 1]

    @property
    def nbytes(self) -> int:
        return self.a.nbytes + self.bt.nbytes


@dataclass
class LoRAStats:
    loads: int = 0  # adapters read from disk
    load_seconds: float = 0.0  # time spent reading them and rebuilding the slots


class LoRAManager:
    """Loaded adapters, slots and per-step masks of one base model (see the module docstring)."""

    def __init__(self, config: LoRAConfig, shapes: BaseShapes, dtype: torch.dtype) -> None:
        self.config = config
        self.shapes = shapes
        self.dtype = dtype
        self.stats = LoRAStats()
        self._loaded: OrderedDict[str, Adapter] = OrderedDict()  # name -> adapter, LRU first
        self._slots: list[Adapter | None] = [None] * config.max_loras
        self._slot_use: list[int] = [0] * config.max_loras  # step counter of the last use
        self._steps = 0
        self._stacks = {
            (layer, group): self._allocate(group)
            for layer in range(shapes.num_layers)
            for group in GROUPS
        }  # (layer, group) -> the slots' stacked matrices
        self.kernel = dtype == torch.float32 and kernels.loaded()  # csrc/lora.cpp runs the deltas
        self._rows: torch.Tensor | None = None  # in a step with adapters: (T,) slots, -1 = none
        self._groups: list[tuple[int, torch.Tensor]] = []  # (slot, its rows) for the torch path
        self._written: set[tuple[int, str]] = set()  # (layer, group)s some adapter wrote to

    # ---------------------------------------------------------------- adapters in memory

    def check(self, lora: LoRARequest) -> None:
        """Load the adapter now (or touch it): ValueError when it does not fit the base."""
        self._adapter(lora)

    def drop(self, names: Sequence[str]) -> None:
        """Forget unregistered adapters and free their slots."""
        for name in names:
            self._loaded.pop(name, None)
        for slot, adapter in enumerate(self._slots):
            if adapter is not None and adapter.lora.name in names:
                self._write_slot(slot, None)

    @property
    def resident(self) -> list[str]:
        """Adapters in memory, least recently used first."""
        return list(self._loaded)

    @property
    def resident_bytes(self) -> int:
        stacks = sum(g.nbytes for g in self._stacks.values())
        return sum(a.nbytes for a in self._loaded.values()) + stacks

    def _adapter(self, lora: LoRARequest) -> Adapter:
        adapter = self._loaded.get(lora.name)
        if adapter is not None and adapter.lora == lora:
            self._loaded.move_to_end(lora.name)
            return adapter
        start = time.perf_counter()
        adapter = read_adapter(lora, self.shapes, self.config.max_lora_rank, self.dtype)
        self.stats.loads += 1
        self.stats.load_seconds += time.perf_counter() - start
        self._loaded[lora.name] = adapter
        limit, budget = self.config.max_cpu_loras, self.config.max_cpu_lora_bytes
        while len(self._loaded) > 1 and (
            len(self._loaded) > limit or sum(a.nbytes for a in self._loaded.values()) > budget
        ):
            self._loaded.popitem(last=False)  # never the newest: it is at the end
        return adapter

    # ---------------------------------------------------------------- one step

    @contextmanager
    def step(self, rows: Sequence[tuple[LoRARequest | None, int]]) -> Iterator[None]:
        """Apply adapters inside the block: rows = (adapter or None, number of rows) per
        request, in the order of the forward's flat batch. Without any adapter the hooks add
        nothing."""
        wanted = list(dict.fromkeys(lora for lora, _ in rows if lora is not None))
        if not wanted:
            yield
            return
        slot_of = self._assign(wanted)
        slots = [slot_of[lora] if lora else -1 for lora, n in rows for _ in range(n)]
        self._rows = torch.tensor(slots, dtype=torch.long)  # (T,)
        if not self.kernel:
            self._groups = [
                (slot, torch.tensor([t for t, s in enumerate(slots) if s == slot]))
                for slot in sorted(set(slot_of.values()))
            ]
        try:
            yield
        finally:
            self._rows = None
            self._groups = []

    def applies(self, layer: int, group: str) -> bool:
        """True in a step with adapters when some adapter has touched this layer's group."""
        return self._rows is not None and (layer, group) in self._written

    def add_delta(self, y: torch.Tensor, x: torch.Tensor, layer: int, group: str) -> None:
        """y (T, out) += the adapters' delta for x (T, in), row by row (in a step only)."""
        if self._rows is None or not self.applies(layer, group):
            return  # no adapter in the step, or none has touched this group
        stacks = self._stacks[(layer, group)]
        if self.kernel:
            torch.ops.modelyard_kernels.lora_add(
                y, x.contiguous(), stacks.a, stacks.bt, self._rows, stacks.bounds
            )
            return
        rank = stacks.a.shape[2] // (len(stacks.bounds) - 1)
        for slot, rows in self._groups:
            u = x.index_select(0, rows) @ stacks.a[slot]  # (rows, n * R)
            for i, (start, end) in enumerate(itertools.pairwise(stacks.bounds)):
                delta = u[:, i * rank : (i + 1) * rank] @ stacks.bt[slot, :, start:end]
                y[:, start:end].index_add_(0, rows, delta)

    def swiglu(self, both: torch.Tensor, x: torch.Tensor, layer: int, width: int) -> torch.Tensor:
        """silu(gate) * up (T, width) from `both`, packed_linear's output on pack_swiglu's
        weight, with the gate/up deltas added first (float32 kernels, in a step that
        `applies` to the layer's gate_up)."""
        if self._rows is None:  # pragma: no cover - the hook asks `applies` first
            raise RuntimeError("LoRAManager.swiglu outside a step with adapters")
        stacks = self._stacks[(layer, "gate_up")]
        out: torch.Tensor = torch.ops.modelyard_kernels.lora_swiglu(
            both, x, stacks.a, stacks.bt, self._rows, width
        )
        return out

    def _assign(self, loras: list[LoRARequest]) -> dict[LoRARequest, int]:
        """A slot for each of the step's adapters (loading, evicting and writing as needed)."""
        self._steps += 1
        adapters = [self._adapter(lora) for lora in loras]
        needed = {id(a) for a in adapters}
        slot_of: dict[LoRARequest, int] = {}
        for adapter in adapters:
            slot = next((i for i, a in enumerate(self._slots) if a is adapter), None)
            if slot is None:
                slot = self._free_slot(needed)
                start = time.perf_counter()
                self._write_slot(slot, adapter)
                self.stats.load_seconds += time.perf_counter() - start
            self._slot_use[slot] = self._steps
            slot_of[adapter.lora] = slot
        return slot_of

    def _free_slot(self, needed: set[int]) -> int:
        """An empty slot, else the least recently used one whose adapter the step does not need."""
        free = [i for i, a in enumerate(self._slots) if a is None or id(a) not in needed]
        if not free:
            raise RuntimeError(f"more than max_loras={self.config.max_loras} adapters in a step")
        empty = [i for i in free if self._slots[i] is None]
        return empty[0] if empty else min(free, key=lambda i: self._slot_use[i])

    def _write_slot(self, slot: int, adapter: Adapter | None) -> None:
        """Put the adapter's matrices in the slot (zeroing the previous ones)."""
        self._slots[slot] = adapter
        touched = {(layer, _MODULE_GROUP[m]) for layer, m in adapter.weights} if adapter else set()
        for key in sorted(touched | self._written):
            stacks = self._stacks[key]
            stacks.a[slot] = 0
            stacks.bt[slot] = 0
            rank = stacks.a.shape[2] // len(GROUPS[key[1]])
            for i, module in enumerate(GROUPS[key[1]]):
                pair = adapter.weights.get((key[0], module)) if adapter is not None else None
                if pair is not None:
                    a, b = pair
                    stacks.a[slot, :, i * rank : i * rank + a.shape[0]] = a.T
                    start, end = stacks.bounds[i], stacks.bounds[i + 1]
                    stacks.bt[slot, : a.shape[0], start:end] = b.T
        self._written |= touched

    def _allocate(self, group: str) -> _GroupStacks:
        modules = GROUPS[group]
        rank = -(-self.config.max_lora_rank // 16) * 16  # a multiple of the kernel's blocks
        size_in = self.shapes.modules[modules[0]][0]
        outs = [self.shapes.modules[m][1] for m in modules]
        slots = self.config.max_loras
        return _GroupStacks(
            torch.zeros(slots, size_in, len(modules) * rank, dtype=self.dtype),
            torch.zeros(slots, rank, sum(outs), dtype=self.dtype),
            [sum(outs[:i]) for i in range(len(outs) + 1)],
        )
