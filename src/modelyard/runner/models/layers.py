"""A decoder's projections, built from a `WeightSource` (runner.weights) by checkpoint name.

The choice between a weight's quantized blocks and a float copy is made here and only here:
`projection` and `gated_mlp` use GGUF blocks (runner.gguf_weights) where the source offers
them for every part of the layer, else float `Linear` / `SwiGLU` (runner.linear), packed once
for the runner's GEMM where `pack` says so. A projection of several checkpoint weights (q, k and
v) is one weight of their rows in order; a fused checkpoint weight (Phi-3's gate_up_proj) is
split where the layer needs its halves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from modelyard.runner.gguf_weights import (
    Blocks,
    GGUFEmbedding,
    GGUFGatedMLP,
    GGUFLinear,
    dot_of,
)
from modelyard.runner.kernel_config import KernelConfig
from modelyard.runner.linear import Linear, SwiGLU
from modelyard.runner.lora.hooks import LoRAGatedMLP, LoRAProjection
from modelyard.runner.lora.manager import LoRAManager
from modelyard.runner.models import moe
from modelyard.runner.models.arch import Activation, Arch
from modelyard.runner.weights import WeightSource, optional

Projection = Callable[[torch.Tensor], torch.Tensor]
Lookup = Callable[[torch.Tensor], torch.Tensor]  # ids (T,) -> (T, H)


@dataclass(frozen=True, slots=True)
class Build:
    """How a model's float weights are kept: its dtype, packed once or not, the switches."""

    dtype: torch.dtype
    pack: bool  # runner.linear.packing_available for the dtype
    kernel_config: KernelConfig

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
        return Linear(weight, bias, pack=self.pack, kernel_config=self.kernel_config)


@dataclass(slots=True)
class LayerWeights:
    """One decoder layer; shapes with H = hidden, nh/nkv heads, hd head dim, I = intermediate.
    Norm weights are in the model's dtype, or float32 (1 + w) for Gemma's norms (arch)."""

    input_norm: torch.Tensor  # (H,)
    qkv: Projection  # H -> (nh + 2 * nkv) * hd, q rows then k then v (biases where given)
    o: Projection  # nh * hd -> H
    post_norm: torch.Tensor  # (H,) the norm before the MLP
    mlp: Projection  # the whole MLP, H -> H (a MoE layer's from runner.models.moe)
    mlp_in: Projection | None  # dense: H -> I, act(gate) * up (None for a MoE layer)
    down: Projection | None  # dense: I -> H
    q_norm: torch.Tensor | None = None  # (hd,) over each head's q before rope (Qwen3, Gemma)
    k_norm: torch.Tensor | None = None  # (hd,)
    attn_out_norm: torch.Tensor | None = None  # (H,) Gemma: on the attention output
    mlp_out_norm: torch.Tensor | None = None  # (H,) Gemma: on the MLP output


def build_layer(
    source: WeightSource,
    arch: Arch,
    config: Any,
    index: int,
    build: Build,
    lora: LoRAManager | None,
) -> LayerWeights:
    """Layer `index` from its checkpoint weights (model.layers.{index}.*); with `lora`, its
    projections wrapped by runner.lora.hooks (the model checked that LoRA fits)."""
    p = f"model.layers.{index}."
    attn = p + "self_attn."
    qkv_names = [attn + "qkv_proj"] if arch.fused_qkv else [attn + f"{x}_proj" for x in "qkv"]
    qkv, o = projection(source, qkv_names, build), projection(source, [attn + "o_proj"], build)
    mlp_in: Projection | None = None
    down: Projection | None = None
    if lora is not None:  # the hook: adapter deltas on every projection
        qkv = LoRAProjection(qkv, lora, index, "qkv")
        o = LoRAProjection(o, lora, index, "o")
    if moe.is_moe_layer(config, index):
        mlp = moe.build_moe(
            source, index, config, dtype=build.dtype, pack=build.pack,
            kernel_config=build.kernel_config,
        )  # fmt: skip
    else:
        up_names = ["gate_up_proj"] if arch.fused_gate_up else ["gate_proj", "up_proj"]
        names = [f"{p}mlp.{n}" for n in up_names]
        down = projection(source, [p + "mlp.down_proj"], build)
        if lora is not None:
            gate, up = gate_up_weights(source, names, build.dtype)
            mlp_in = LoRAGatedMLP(
                gate, up, lora, index, pack=build.pack, kernel_config=build.kernel_config
            )
            down = LoRAProjection(down, lora, index, "down")
        else:
            mlp_in = gated_mlp(source, names, arch.activation, build)
        mlp = DenseMLP(mlp_in, down)

    def norm(name: str) -> torch.Tensor:
        return norm_weight(source.tensor(name + ".weight"), arch, build.dtype)

    sandwich = arch.sandwich_norms
    return LayerWeights(
        input_norm=norm(p + "input_layernorm"),
        qkv=qkv,
        o=o,
        post_norm=norm(
            p + ("pre_feedforward_layernorm" if sandwich else "post_attention_layernorm")
        ),
        mlp=mlp,
        mlp_in=mlp_in,
        down=down,
        q_norm=norm(attn + "q_norm") if arch.qk_norm else None,
        k_norm=norm(attn + "k_norm") if arch.qk_norm else None,
        attn_out_norm=norm(p + "post_attention_layernorm") if sandwich else None,
        mlp_out_norm=norm(p + "post_feedforward_layernorm") if sandwich else None,
    )


def norm_weight(weight: torch.Tensor, arch: Arch, dtype: torch.dtype) -> torch.Tensor:
    """A norm's weight as the decoder's `rms_norm` takes it: in the dtype, or 1 + w in float32
    for Gemma's norms (HF: `x * (1.0 + w.float())`)."""
    return 1.0 + weight.float() if arch.norm_offset else weight.to(dtype)


def projection(source: WeightSource, names: Sequence[str], build: Build) -> Projection:
    """One linear layer over the rows of the weights `names` ("...self_attn.q_proj", without
    ".weight") in order; biases where the checkpoint has them (zeros for the parts without)."""
    biases = [optional(source, f"{n}.bias") for n in names]
    bias = None
    if any(b is not None for b in biases):
        sizes = [_rows(source, n) for n in names]
        bias = torch.cat(
            [
                torch.zeros(rows) if b is None else b.float()
                for b, rows in zip(biases, sizes, strict=True)
            ]
        )
    parts = [source.blocks(f"{n}.weight") for n in names]
    if all(p is not None for p in parts):
        present = [p for p in parts if p is not None]
        return GGUFLinear.of_parts(present, bias, dot_of(build.kernel_config))
    weight = torch.cat([source.tensor(f"{n}.weight").to(build.dtype) for n in names])
    return build.linear(weight.contiguous(), None if bias is None else bias.to(build.dtype))


def gated_mlp(
    source: WeightSource, names: Sequence[str], activation: Activation, build: Build
) -> Projection:
    """act(x Wg^T) * (x Wu^T), (T, H) -> (T, I): `names` are the gate and up weights, or one
    fused weight with the gate's rows first."""
    gate_blocks, up_blocks = _halves_blocks(source, names)
    if gate_blocks is not None and up_blocks is not None:
        return GGUFGatedMLP(gate_blocks, up_blocks, activation, dot_of(build.kernel_config))
    gate, up = gate_up_weights(source, names, build.dtype)
    if activation == "silu":
        return SwiGLU(gate, up, pack=build.pack, kernel_config=build.kernel_config)
    return GeGLU(build.linear(gate, None), build.linear(up, None))


def gate_up_weights(
    source: WeightSource, names: Sequence[str], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The float gate and up weights (I, H) each, of two checkpoint weights or one fused."""
    if len(names) == 1:
        both = source.tensor(f"{names[0]}.weight").to(dtype)
        half = both.shape[0] // 2
        return both[:half].contiguous(), both[half:].contiguous()
    gate, up = names
    return source.tensor(f"{gate}.weight").to(dtype), source.tensor(f"{up}.weight").to(dtype)


def embedding(source: WeightSource, dtype: torch.dtype) -> tuple[Lookup, torch.Tensor | None]:
    """The token embedding, ids (T,) -> (T, H) in `dtype`, and its float (V, H) table (None when
    the rows stay GGUF blocks, dequantized only as gathered: a 262k-row table is never widened
    whole)."""
    name = "model.embed_tokens.weight"
    blocks = source.blocks(name)
    if blocks is not None:
        rows = GGUFEmbedding(blocks)
        return (lambda ids: rows(ids).to(dtype)), None
    table = source.tensor(name).to(dtype)  # (V, H)
    return (lambda ids: table.index_select(0, ids)), table


def head(source: WeightSource, embed: torch.Tensor | None, tied: bool, build: Build) -> Projection:
    """The lm_head, H -> V: the embedding's (V, H) table when tied (packing makes its own copy;
    the table stays for lookups) or its GGUF blocks, else lm_head.weight."""
    if not tied:
        return projection(source, ["lm_head"], build)
    blocks = source.blocks("model.embed_tokens.weight")
    if blocks is not None:
        return GGUFLinear(blocks, None, dot_of(build.kernel_config))
    if embed is None:
        raise ValueError("a tied lm_head without the embedding table")
    return build.linear(embed, None)


class GeGLU:
    """gelu_tanh(x Wg^T) * (x Wu^T) (Gemma's MLP input side), each product in x's dtype as
    transformers computes it."""

    __slots__ = ("gate", "up")

    def __init__(self, gate: Projection, up: Projection) -> None:
        self.gate = gate
        self.up = up

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.gate(x), approximate="tanh").mul_(self.up(x))


class DenseMLP:
    """A layer's whole gated MLP, (T, H) -> (T, H): down(mlp_in(x))."""

    __slots__ = ("down", "mlp_in")

    def __init__(self, mlp_in: Projection, down: Projection) -> None:
        self.mlp_in = mlp_in
        self.down = down

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.mlp_in(x))


def _halves_blocks(
    source: WeightSource, names: Sequence[str]
) -> tuple[Blocks | None, Blocks | None]:
    """The gate and up weights' GGUF blocks (None where the source has none)."""
    if len(names) == 2:
        return source.blocks(f"{names[0]}.weight"), source.blocks(f"{names[1]}.weight")
    both = source.blocks(f"{names[0]}.weight")
    if both is None:
        return None, None
    half = both.n // 2
    return Blocks(both.kind, both.raw[:half], both.k), Blocks(both.kind, both.raw[half:], both.k)


def _rows(source: WeightSource, name: str) -> int:
    blocks = source.blocks(f"{name}.weight")
    return blocks.n if blocks is not None else int(source.tensor(f"{name}.weight").shape[0])
