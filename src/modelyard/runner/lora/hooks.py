"""The hooks that put a step's LoRA deltas on a Llama layer's projections (runner.lora.manager holds
the adapters and computes the deltas; runner.models.layers wraps each layer with these)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from modelyard.runner import kernels
from modelyard.runner.kernel_config import KernelConfig
from modelyard.runner.linear import Linear, int8_weights
from modelyard.runner.lora.manager import LoRAManager


class LoRAProjection:
    """A base projection plus the step's adapter deltas (the hook runner.models.layers puts on
    qkv, o and down)."""

    __slots__ = ("base", "group", "layer", "lora")

    def __init__(
        self,
        base: Callable[[torch.Tensor], torch.Tensor],
        lora: LoRAManager,
        layer: int,
        group: str,
    ) -> None:
        self.base = base
        self.lora = lora
        self.layer = layer
        self.group = group

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.lora.applies(self.layer, self.group):
            self.lora.add_delta(y, x, self.layer, self.group)
        return y


class LoRAGatedMLP:
    """The MLP's input side of a LoRA model, silu(gate) * up. float32 with the kernels: the
    base model's fused SwiGLU kernel, or with the step's adapters one GEMM on its packed weight
    (gate and up columns alternating in 16s) and `LoRAManager.swiglu`. Otherwise [gate | up] in
    one GEMM, the deltas, then the activation."""

    __slots__ = ("both", "fused_act", "layer", "lora", "packed", "width")

    def __init__(
        self,
        gate: torch.Tensor,
        up: torch.Tensor,
        lora: LoRAManager,
        layer: int,
        *,
        pack: bool,
        kernel_config: KernelConfig,
    ) -> None:
        self.width = int(gate.shape[0])
        self.lora = lora
        self.layer = layer
        fused = pack and lora.kernel and not int8_weights(kernel_config)
        self.packed = kernels.pack_swiglu(gate, up) if fused else None
        both = torch.cat([gate, up]).contiguous()
        self.both = None if fused else Linear(both, None, pack=pack, kernel_config=kernel_config)
        self.fused_act = gate.dtype == torch.bfloat16 and kernels.loaded()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        applies = self.lora.applies(self.layer, "gate_up")
        if self.packed is not None:
            x = x.contiguous()
            if not applies:
                return kernels.packed_swiglu(x, self.packed, self.width)
            both = kernels.packed_linear(x, self.packed, 2 * (-(-self.width // 16) * 16), None)
            return self.lora.swiglu(both, x, self.layer, self.width)
        if self.both is None:  # pragma: no cover - one of the two is always set
            raise RuntimeError("LoRAGatedMLP has no weight")
        both = self.both(x)  # (T, 2I)
        if applies:
            self.lora.add_delta(both, x, self.layer, "gate_up")
        if self.fused_act:
            return kernels.silu_mul(both.contiguous())
        gate, up = both.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)
