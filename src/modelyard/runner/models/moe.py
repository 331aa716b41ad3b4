"""The mixture-of-experts MLP of Qwen3-MoE, Mixtral and Qwen2-MoE decoder layers.

`build_moe` gives a sparse layer's whole MLP, x (T, H) -> (T, H), computed in five steps:
1. Route: one GEMM gives the router's logits over the E experts (Qwen2-MoE: and its shared
   expert's gate logit as one more column); softmax in float32, top-k, then the family's rule:
   Qwen3-MoE / Qwen2-MoE renormalise the k weights when `norm_topk_prob` and cast them to the
   model's dtype; Mixtral always renormalises and keeps them in float32 (transformers 5.x).
2. Group: the T * k (token, slot) assignments are sorted by expert, and their rows gathered
   into one matrix in which each expert's rows are contiguous.
3. Compute: each expert hit runs once on its rows: gate/up as one fused SwiGLU, then down
   (`runner.linear`, packed for the runner's GEMM; GGUF blocks where the source has them).
   Only the experts loop in Python, never the tokens.
4. Combine: each row is scaled by its routing weight and added to its token's row
   (`index_add_` into float32, rounded to the model's dtype once, as transformers' default
   grouped experts sum the k slots).
5. Qwen2-MoE adds its shared expert, scaled by the sigmoid of its gate.

Checkpoints keep the experts either one tensor per expert (the released models, and what
transformers 5.x `save_pretrained` writes: `mlp.experts.{e}.{gate,up,down}_proj.weight`;
Mixtral `block_sparse_moe.experts.{e}.w1/w3/w2.weight`) or fused 3-D (transformers' in-memory
layout: `mlp.experts.gate_up_proj` (E, 2I, H), gate rows first, and `mlp.experts.down_proj`
(E, H, I)); both are read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from modelyard.runner.gguf_weights import GGUFLinear, GGUFSwiGLU, dot_of
from modelyard.runner.kernel_config import KernelConfig
from modelyard.runner.linear import Linear, SwiGLU
from modelyard.runner.weights import WeightSource

Layer = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class _Family:
    """How one architecture's config and routing read."""

    experts_key: str  # the config attribute with the number of experts
    intermediate_key: str  # ... with each expert's intermediate size
    always_renormalise: bool  # Mixtral: the top-k weights always sum to 1
    weights_in_model_dtype: bool  # Qwen: routing weights cast to the model's dtype to scale
    every_layer: bool  # Mixtral: every layer is sparse (no decoder_sparse_step)
    shared_expert: bool  # Qwen2-MoE: a dense expert on every token, gated by a sigmoid


_FAMILIES = {
    "qwen3_moe": _Family("num_experts", "moe_intermediate_size", False, True, False, False),
    "qwen2_moe": _Family("num_experts", "moe_intermediate_size", False, True, False, True),
    "mixtral": _Family("num_local_experts", "intermediate_size", True, False, True, False),
}
_PREFIXES = ("mlp", "block_sparse_moe")  # where a layer's MoE block sits in the checkpoint
# the names of an expert's gate, up and down weights in per-expert checkpoints
_EXPERT_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))


def _family(config: Any) -> _Family | None:
    return _FAMILIES.get(str(getattr(config, "model_type", "")))


def is_moe_layer(config: Any, index: int) -> bool:
    """True when layer `index` of this HF config has a sparse MoE MLP (as transformers builds
    it: Mixtral every layer; Qwen3-MoE / Qwen2-MoE where `num_experts` > 0, the layer is not in
    `mlp_only_layers` and (index + 1) is a multiple of `decoder_sparse_step`)."""
    family = _family(config)
    if family is None or not 0 <= index < int(config.num_hidden_layers):
        return False
    if family.every_layer:
        return True
    step = int(getattr(config, "decoder_sparse_step", 1) or 1)
    dense = index in (getattr(config, "mlp_only_layers", None) or [])
    return (
        int(getattr(config, family.experts_key, 0) or 0) > 0
        and not dense
        and (index + 1) % step == 0
    )


@dataclass(frozen=True, slots=True)
class _Routing:
    """One layer's routing rule."""

    experts: int  # E
    top_k: int  # k experts per token
    renormalise: bool  # the k weights divided by their sum
    weights_in_model_dtype: bool  # cast to the model's dtype before scaling (else float32)


@dataclass(frozen=True, slots=True)
class _Expert:
    """One expert's MLP: silu(x Wg^T) * (x Wu^T), then down."""

    gate_up: Layer  # (n, H) -> (n, I)
    down: Layer  # (n, I) -> (n, H)


class _MoE:
    """A sparse layer's MLP (the module docstring's steps)."""

    __slots__ = ("_experts", "_router", "_routing", "_shared")

    def __init__(
        self,
        router: Layer,
        routing: _Routing,
        experts: list[_Expert],
        shared: _Expert | None,
    ) -> None:
        self._router = router  # (T, H) -> (T, E) logits, + 1 column: the shared gate's
        self._routing = routing
        self._experts = experts
        self._shared = shared

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = self._router(x)  # (T, E [+ 1])
        weights, ids = self._route(logits[:, : self._routing.experts])  # (T, k) each
        out = self._grouped(x, weights, ids).to(x.dtype)  # (T, H)
        if self._shared is not None:
            shared = self._shared.down(self._shared.gate_up(x))  # (T, H)
            out = out + torch.sigmoid(logits[:, self._routing.experts :]) * shared
        return out

    def _route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(T, E) logits -> the k experts of each token and their weights, (T, k) each."""
        routing = self._routing
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)  # (T, E)
        weights, ids = torch.topk(probs, routing.top_k, dim=-1)  # (T, k)
        if routing.renormalise:
            weights /= weights.sum(dim=-1, keepdim=True)
        if routing.weights_in_model_dtype:
            weights = weights.to(logits.dtype)
        return weights, ids

    def _grouped(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Each expert run once on all of its rows: (T, H) -> (T, H) float32."""
        k = self._routing.top_k
        flat = ids.flatten()  # (T * k,) the expert of each (token, slot)
        order = torch.argsort(flat, stable=True)  # assignments grouped by expert
        tokens = order // k  # (T * k,) the token of each sorted assignment
        rows = x.index_select(0, tokens)  # (T * k, H), each expert's rows contiguous
        counts = torch.bincount(flat, minlength=self._routing.experts).tolist()  # (E,)
        y = torch.empty_like(rows)  # (T * k, H)
        start = 0
        for expert, n in zip(self._experts, counts, strict=True):
            if n:
                y[start : start + n] = expert.down(expert.gate_up(rows[start : start + n]))
                start += n
        scaled = y * weights.flatten()[order, None]  # Qwen: in the model's dtype; Mixtral: f32
        out = torch.zeros(x.shape, dtype=torch.float32)
        return out.index_add_(0, tokens, scaled.float())


def build_moe(
    source: WeightSource,
    index: int,
    config: Any,
    *,
    dtype: torch.dtype,
    pack: bool,
    kernel_config: KernelConfig,
) -> Layer:
    """Layer `index`'s whole MLP, x (T, H) -> (T, H) in `dtype`, from the checkpoint's weights
    (`is_moe_layer(config, index)` must hold: ValueError otherwise, or for an activation other
    than SiLU). `pack`: `runner.linear.packing_available(dtype, kernel_config)`."""
    family = _family(config)
    if family is None or not is_moe_layer(config, index):
        raise ValueError(f"layer {index} of a {config.model_type!r} model is not a MoE layer")
    if str(getattr(config, "hidden_act", "silu")) != "silu":
        raise ValueError(f"MoE experts with {config.hidden_act!r}: only silu is supported")
    names = source.names()
    prefix = _prefix(names, index)
    loader = _Loader(source, dtype, pack, kernel_config)
    routing = _Routing(
        experts=int(getattr(config, family.experts_key)),
        top_k=int(config.num_experts_per_tok),
        renormalise=family.always_renormalise or bool(getattr(config, "norm_topk_prob", False)),
        weights_in_model_dtype=family.weights_in_model_dtype,
    )
    router_rows = [loader.tensor(f"{prefix}.gate.weight")]  # (E, H)
    shared = None
    if family.shared_expert:
        router_rows.append(loader.tensor(f"{prefix}.shared_expert_gate.weight"))  # (1, H)
        shared = loader.expert(f"{prefix}.shared_expert.", _EXPERT_NAMES[0])
    router = Linear(
        torch.cat(router_rows).contiguous(), None, pack=pack, kernel_config=kernel_config
    )
    experts = _experts(loader, names, f"{prefix}.experts", routing.experts)
    return _MoE(router, routing, experts, shared)


def _prefix(names: frozenset[str], index: int) -> str:
    """Where layer `index`'s MoE block sits: `model.layers.{index}.mlp` or `.block_sparse_moe`."""
    for part in _PREFIXES:
        prefix = f"model.layers.{index}.{part}"
        if f"{prefix}.gate.weight" in names:
            return prefix
    raise ValueError(f"no MoE router weight for layer {index} in the checkpoint")


def _experts(loader: _Loader, names: frozenset[str], prefix: str, count: int) -> list[_Expert]:
    """The E experts under `prefix` ("model.layers.{i}.mlp.experts"), fused 3-D or per expert."""
    if f"{prefix}.gate_up_proj" in names:
        return _fused_experts(loader, prefix, count)
    for expert_names in _EXPERT_NAMES:
        if f"{prefix}.0.{expert_names[0]}.weight" in names:
            return [loader.expert(f"{prefix}.{e}.", expert_names) for e in range(count)]
    raise ValueError(f"no expert weights under {prefix} in the checkpoint")


def _fused_experts(loader: _Loader, prefix: str, count: int) -> list[_Expert]:
    """Experts from transformers' fused tensors: gate_up_proj (E, 2I, H), down_proj (E, H, I)."""
    gate_up = loader.tensor(f"{prefix}.gate_up_proj")
    down = loader.tensor(f"{prefix}.down_proj")
    width = int(gate_up.shape[1]) // 2
    if (
        gate_up.dim() != 3
        or gate_up.shape[0] != count
        or down.shape[:2] != (count, gate_up.shape[2])
    ):
        raise ValueError(
            f"{prefix}: fused experts of shapes {tuple(gate_up.shape)} and {tuple(down.shape)}, "
            f"expected ({count}, 2I, H) and ({count}, H, I)"
        )
    return [
        _Expert(
            loader.swiglu(gate_up[e, :width].contiguous(), gate_up[e, width:].contiguous()),
            loader.linear(down[e].contiguous()),
        )
        for e in range(count)
    ]


class _Loader:
    """Builds layers from a source's weights: GGUF blocks where it has them, else float ones in
    the model's dtype, packed for the runner's GEMM when `pack`."""

    def __init__(
        self, source: WeightSource, dtype: torch.dtype, pack: bool, kernel_config: KernelConfig
    ) -> None:
        self._source = source
        self._dtype = dtype
        self._pack = pack
        self._kernel_config = kernel_config

    def tensor(self, name: str) -> torch.Tensor:
        return self._source.tensor(name).to(self._dtype)

    def swiglu(self, gate: torch.Tensor, up: torch.Tensor) -> Layer:
        return SwiGLU(gate, up, pack=self._pack, kernel_config=self._kernel_config)

    def linear(self, weight: torch.Tensor) -> Layer:
        return Linear(weight, None, pack=self._pack, kernel_config=self._kernel_config)

    def expert(self, prefix: str, names: tuple[str, str, str]) -> _Expert:
        """The expert whose gate, up and down weights are `{prefix}{name}.weight`."""
        gate, up, down = (f"{prefix}{name}.weight" for name in names)
        gate_blocks, up_blocks = self._source.blocks(gate), self._source.blocks(up)
        if gate_blocks is not None and up_blocks is not None and gate_blocks.kind == up_blocks.kind:
            gate_up: Layer = GGUFSwiGLU(gate_blocks, up_blocks, dot_of(self._kernel_config))
        else:
            gate_up = self.swiglu(self.tensor(gate), self.tensor(up))
        down_blocks = self._source.blocks(down)
        if down_blocks is not None:
            return _Expert(gate_up, GGUFLinear(down_blocks, None, dot_of(self._kernel_config)))
        return _Expert(gate_up, self.linear(self.tensor(down)))
