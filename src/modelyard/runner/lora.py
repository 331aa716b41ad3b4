"""LoRA adapters on a loaded base model: per-row deltas inside the step, weights never merged.

A PEFT adapter adds, to a projection y = W x, the delta s * B (A x) with A (r, in), B (out, r)
and s = alpha / r (alpha / sqrt(r) with use_rslora; rank_pattern and alpha_pattern honoured).
Here, for every layer and projection group of the native Llama forward (qkv, o, gate_up, down;
a group's n modules share their input x):

- `max_loras` slots of `max_lora_rank` (R) columns per module. A_stack (n * S * R, in) holds
  every slot's A matrices, module-major (module i, slot s at rows (i * S + s) * R), and one
  B_stack (out_i, S * R) per module their scaled B matrices: one A GEMM and one B GEMM per
  module serve every adapter of a step. A slot is written in place when an adapter takes it
  (its old columns zeroed first), so nothing is re-laid out when adapters come and go;
- per step, a 0/1 mask (T, n * S * R) keeps, in each row, the columns of its own slot:
  delta_i = B_i(mask * A_stack(x))[module i's columns]. A row without an adapter gets exactly
  0; rows of different adapters share the step (grouped by slot, not by merging weights);
- `LoRAManager` holds the adapters loaded from disk (least recently used dropped past
  `max_cpu_loras` or `max_cpu_lora_bytes`) and which one sits in which slot (a step's adapters
  get slots, evicting the least recently used adapters the step does not need). The scheduler
  admits at most `max_loras` different adapters among running requests, so a step always fits.
  The stacks are allocated with the model (their size is the price of LoRA capacity), so
  taking a slot only copies an adapter's matrices.

The hooks (`LoRAProjection`, `LoRAGatedMLP`) wrap a layer's projections in runner.models.llama.
On a LoRA model the MLP's gate/up run unfused (one GEMM, then the delta, then the activation).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import safe_open

from modelyard.engine.config import LoRAConfig
from modelyard.engine.messages import LoRARequest
from modelyard.runner import kernels
from modelyard.runner.linear import Linear

#: projection group -> (PEFT module names in output order)
GROUPS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}
_MODULE_GROUP = {m: g for g, modules in GROUPS.items() for m in modules}
_KEY = re.compile(r"(?:.*\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


@dataclass(frozen=True)
class BaseShapes:
    """The base model's projection shapes: module -> (in_features, out_features)."""

    num_layers: int
    modules: dict[str, tuple[int, int]]

    @classmethod
    def of(cls, config: Any) -> BaseShapes:
        hidden, heads = config.hidden_size, config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        inter = config.intermediate_size
        modules = {
            "q_proj": (hidden, heads * head_dim),
            "k_proj": (hidden, kv_heads * head_dim),
            "v_proj": (hidden, kv_heads * head_dim),
            "o_proj": (heads * head_dim, hidden),
            "gate_proj": (hidden, inter),
            "up_proj": (hidden, inter),
            "down_proj": (inter, hidden),
        }
        return cls(config.num_hidden_layers, modules)


@dataclass
class Adapter:
    """One adapter in memory: (layer, module) -> (A (r, in), s * B (out, r))."""

    lora: LoRARequest
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    nbytes: int


def read_adapter(
    lora: LoRARequest, shapes: BaseShapes, max_rank: int, dtype: torch.dtype
) -> Adapter:
    """Load a PEFT folder, checked against the base (ValueError naming what does not fit)."""
    folder = Path(lora.path)
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"adapter {lora.name!r}: no readable adapter_config.json") from exc
    if config.get("peft_type", "LORA") != "LORA" or config.get("use_dora"):
        raise ValueError(f"adapter {lora.name!r}: only plain LoRA adapters are supported")
    if config.get("fan_in_fan_out") or config.get("bias", "none") != "none":
        raise ValueError(f"adapter {lora.name!r}: fan_in_fan_out and biases are not supported")
    tensors = _read_tensors(folder / "adapter_model.safetensors", lora.name)
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, module), (a, b) in tensors.items():
        rank = a.shape[0]
        expected_in, expected_out = shapes.modules[module]
        if (
            layer >= shapes.num_layers
            or a.shape != (rank, expected_in)
            or b.shape != (expected_out, rank)
        ):
            raise ValueError(f"adapter {lora.name!r}: layer {layer} {module} does not fit the base")
        if rank > max_rank:
            raise ValueError(f"adapter {lora.name!r}: rank {rank} > max_lora_rank {max_rank}")
        part = "self_attn" if _MODULE_GROUP[module] in ("qkv", "o") else "mlp"
        scale = _scaling(config, f"model.layers.{layer}.{part}.{module}", rank)
        weights[(layer, module)] = (a.to(dtype), (b.float() * scale).to(dtype))
    nbytes = sum(a.nbytes + b.nbytes for a, b in weights.values())
    return Adapter(lora, weights, nbytes)


def _read_tensors(
    file: Path, name: str
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(file), "pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                match = _KEY.match(key)
                if match is None or match.group(2) not in _MODULE_GROUP:
                    raise ValueError(f"adapter {name!r}: unsupported tensor {key}")
                layer, module, side = int(match.group(1)), match.group(2), match.group(3)
                pairs.setdefault((layer, module), {})[side] = f.get_tensor(key)
    except OSError as exc:
        raise ValueError(f"adapter {name!r}: no readable adapter_model.safetensors") from exc
    if any(set(p) != {"A", "B"} for p in pairs.values()) or not pairs:
        raise ValueError(f"adapter {name!r}: every module needs lora_A and lora_B")
    return {k: (p["A"], p["B"]) for k, p in pairs.items()}


def _scaling(config: dict[str, Any], module_name: str, rank: int) -> float:
    """s for one module; alpha_pattern keys match the end of its name, as in PEFT."""
    alpha = float(config.get("lora_alpha", rank))
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(?:.*\.)?(?:{pattern})$", module_name):
            alpha = float(value)
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


class _GroupStacks:
    """One layer's group: A_stack (n * S * R, in) and a B_stack (out_i, S * R) per module."""

    __slots__ = ("a", "b", "offsets")

    def __init__(self, a: torch.Tensor, b: list[torch.Tensor], offsets: list[int]) -> None:
        self.a = a
        self.b = b
        self.offsets = offsets  # first output column of each module in the group's output

    @property
    def nbytes(self) -> int:
        return self.a.nbytes + sum(b.nbytes for b in self.b)


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
        self._masks: dict[int, torch.Tensor] | None = None  # width -> (T, width) in a step
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
        slot_of_row = torch.tensor(
            [slot_of[lora] if lora else -1 for lora, n in rows for _ in range(n)],
            dtype=torch.long,
        )  # (T,) -1 = no adapter
        rank, width = self.config.max_lora_rank, self.config.max_loras * self.config.max_lora_rank
        self._masks = {}
        for n in {len(m) for m in GROUPS.values()}:
            col_slot = torch.arange(n * width) % width // rank  # (n * S * R,) module-major
            mask = slot_of_row.unsqueeze(1) == col_slot.unsqueeze(0)
            self._masks[col_slot.numel()] = mask.to(self.dtype)  # (T, n * S * R)
        try:
            yield
        finally:
            self._masks = None

    def add_delta(self, y: torch.Tensor, x: torch.Tensor, layer: int, group: str) -> None:
        """y (T, out) += the adapters' delta for x (T, in), row by row (in a step only)."""
        if self._masks is None:
            return
        if (layer, group) not in self._written:
            return  # no adapter has touched this group
        stacks = self._stacks[(layer, group)]
        u = F.linear(x, stacks.a).mul_(self._masks[stacks.a.shape[0]])  # (T, n * S * R)
        width = stacks.b[0].shape[1]  # S * R
        for i, (b, offset) in enumerate(zip(stacks.b, stacks.offsets, strict=True)):
            delta = F.linear(u[:, i * width : (i + 1) * width], b)  # (T, out_i)
            y[:, offset : offset + b.shape[0]].add_(delta)

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
        """Put the adapter's matrices in the slot's columns (zeroing the previous ones)."""
        rank, size = self.config.max_lora_rank, self.config.max_loras
        self._slots[slot] = adapter
        touched = {(layer, _MODULE_GROUP[m]) for layer, m in adapter.weights} if adapter else set()
        for key in sorted(touched | self._written):
            stacks = self._stacks[key]
            for i, module in enumerate(GROUPS[key[1]]):
                rows = slice((i * size + slot) * rank, (i * size + slot + 1) * rank)
                cols = slice(slot * rank, (slot + 1) * rank)
                stacks.a[rows] = 0
                stacks.b[i][:, cols] = 0
                pair = adapter.weights.get((key[0], module)) if adapter is not None else None
                if pair is not None:
                    a, b = pair
                    stacks.a[rows.start : rows.start + a.shape[0]] = a
                    stacks.b[i][:, cols.start : cols.start + a.shape[0]] = b

        self._written |= touched

    def _allocate(self, group: str) -> _GroupStacks:
        modules = GROUPS[group]
        width = self.config.max_loras * self.config.max_lora_rank
        size_in = self.shapes.modules[modules[0]][0]
        outs = [self.shapes.modules[m][1] for m in modules]
        return _GroupStacks(
            torch.zeros(len(modules) * width, size_in, dtype=self.dtype),
            [torch.zeros(out, width, dtype=self.dtype) for out in outs],
            [sum(outs[:i]) for i in range(len(outs))],
        )


class LoRAProjection:
    """A base projection plus the step's adapter deltas (the hook llama.py puts on qkv, o and
    down)."""

    __slots__ = ("base", "group", "layer", "lora")

    def __init__(self, base: Linear, lora: LoRAManager, layer: int, group: str) -> None:
        self.base = base
        self.lora = lora
        self.layer = layer
        self.group = group

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        self.lora.add_delta(y, x, self.layer, self.group)
        return y


class LoRAGatedMLP:
    """The MLP's input side of a LoRA model: [gate | up] in one GEMM, the deltas, then
    silu(gate) * up (SwiGLU's fused activation cannot take a delta before it)."""

    __slots__ = ("both", "fused_act", "layer", "lora", "width")

    def __init__(
        self, gate: torch.Tensor, up: torch.Tensor, lora: LoRAManager, layer: int, *, pack: bool
    ) -> None:
        self.width = int(gate.shape[0])
        self.both = Linear(torch.cat([gate, up]).contiguous(), None, pack=pack)
        self.lora = lora
        self.layer = layer
        self.fused_act = gate.dtype == torch.bfloat16 and kernels.load()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        both = self.both(x)  # (T, 2I)
        self.lora.add_delta(both, x, self.layer, "gate_up")
        if self.fused_act:
            return kernels.silu_mul(both.contiguous())
        gate, up = both.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)
