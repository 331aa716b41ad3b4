"""Mixture-of-experts MLPs (Qwen3-MoE, Mixtral): a stub until the MoE layers land.

The decoder asks `is_moe_layer` for each layer and, where it is true, uses `build_moe`'s
callable as that layer's whole MLP (the attention stays Qwen3's / Mistral's). With this stub no
layer is MoE, so runner.models.arch keeps the MoE architectures on the generic path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from modelyard.runner.kernel_config import KernelConfig
from modelyard.runner.weights import WeightSource


def is_moe_layer(config: Any, index: int) -> bool:
    """True when layer `index` of this config has a mixture-of-experts MLP (stub: never)."""
    return False


def build_moe(
    source: WeightSource,
    index: int,
    config: Any,
    *,
    dtype: torch.dtype,
    pack: bool,
    kernel_config: KernelConfig,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Layer `index`'s whole MLP, x (T, H) -> (T, H) (stub: not implemented)."""
    raise NotImplementedError("mixture-of-experts layers are not implemented yet")
