"""The MoE MLP (runner.models.moe) against transformers' own layers: tiny random Qwen3-MoE (with
and without norm_topk_prob, a dense layer among the sparse ones), Mixtral and Qwen2-MoE (shared
expert) models saved with save_pretrained (per-expert tensors) and as transformers' fused
in-memory tensors, in float32 (summation order apart) and bfloat16; which layers are sparse;
and each expert run at most once per call."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from gguf import GGMLQuantizationType, quants
from safetensors.torch import save_file

from modelyard.engine.config import kernels_from_environment
from modelyard.runner import kernels
from modelyard.runner.gguf_weights import Q8_0, Blocks, GGUFSwiGLU
from modelyard.runner.linear import SwiGLU, packing_available
from modelyard.runner.models import moe
from modelyard.runner.models.moe import build_moe, is_moe_layer
from modelyard.runner.weights import SafetensorsSource

KERNELS = kernels_from_environment()  # the switches of this test run's environment
HIDDEN = 32

pytestmark = pytest.mark.unit


def _configs() -> dict[str, tuple[Any, int]]:
    """name -> (tiny config, the sparse layer to test)."""
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

    common = {
        "vocab_size": 64,
        "hidden_size": HIDDEN,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "initializer_range": 0.2,  # weights large enough that routing and outputs vary
    }
    qwen3 = {"moe_intermediate_size": 16, "intermediate_size": 24, "num_experts": 8}
    qwen3 |= {"num_experts_per_tok": 3, "head_dim": 16, "num_hidden_layers": 2}
    return {
        "qwen3": (Qwen3MoeConfig(**common, **qwen3, mlp_only_layers=[0]), 1),
        "qwen3_norm": (Qwen3MoeConfig(**common, **qwen3, norm_topk_prob=True), 0),
        "mixtral": (
            MixtralConfig(
                **common,
                intermediate_size=16,
                num_local_experts=4,
                num_experts_per_tok=2,
                num_hidden_layers=1,
            ),
            0,
        ),
        "qwen2": (
            Qwen2MoeConfig(
                **common,
                intermediate_size=24,
                moe_intermediate_size=32,  # GGUF blocks: K a multiple of 32
                shared_expert_intermediate_size=64,
                num_experts=6,
                num_experts_per_tok=4,
                num_hidden_layers=1,
            ),
            0,
        ),
    }


class Tiny:
    """A saved tiny model: its folder, the transformers model and the layer under test."""

    def __init__(self, folder: Path, model: Any, layer: int) -> None:
        self.folder, self.model, self.layer = folder, model, layer

    def reference(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """transformers' MLP of the layer in `dtype`: (T, H) -> (T, H)."""
        mlp = copy.deepcopy(self.model.model.layers[self.layer].mlp).to(dtype)
        with torch.no_grad():
            out: torch.Tensor = mlp(x[None].to(dtype))[0]
        return out

    def build(self, folder: Path | None = None, dtype: torch.dtype = torch.float32) -> Any:
        source = SafetensorsSource(folder or self.folder)
        pack = packing_available(dtype, KERNELS)
        return build_moe(
            source, self.layer, self.model.config, dtype=dtype, pack=pack, kernel_config=KERNELS
        )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tiny]:
    from transformers import AutoModelForCausalLM

    assert kernels.load(KERNELS), "the runner's kernels did not build (see scripts/setup)"
    root = tmp_path_factory.mktemp("tiny_moe")
    models = {}
    for i, (name, (config, layer)) in enumerate(_configs().items()):
        torch.manual_seed(100 + i)
        model = AutoModelForCausalLM.from_config(config).eval()
        model.save_pretrained(root / name)
        models[name] = Tiny(root / name, model, layer)
    return models


NAMES = ["qwen3", "qwen3_norm", "mixtral", "qwen2"]


@pytest.mark.parametrize("name", NAMES)
def test_float32_matches_transformers(tiny: dict[str, Tiny], name: str) -> None:
    model = tiny[name]
    mlp = model.build()
    for rows in (1, 5, 33):
        torch.manual_seed(rows)
        x = torch.randn(rows, HIDDEN)
        expected = model.reference(x, torch.float32)
        torch.testing.assert_close(mlp(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_bfloat16_matches_transformers(tiny: dict[str, Tiny], name: str) -> None:
    """Up to bf16 rounding: the GEMMs round their (T, I) and (T, H) outputs to bf16 as
    transformers' do, but may sum in another order."""
    model = tiny[name]
    mlp = model.build(dtype=torch.bfloat16)
    for rows in (1, 5, 33):
        torch.manual_seed(rows)
        x = torch.randn(rows, HIDDEN).bfloat16()
        expected = model.reference(x, torch.bfloat16)
        out = mlp(x)
        assert out.dtype == torch.bfloat16
        scale = float(expected.abs().max())
        torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2 * scale)


@pytest.mark.parametrize("name", NAMES)
def test_fused_expert_tensors_read_as_per_expert_ones(
    tiny: dict[str, Tiny], name: str, tmp_path: Path
) -> None:
    """transformers' in-memory layout (experts.gate_up_proj (E, 2I, H), experts.down_proj
    (E, H, I), Mixtral under `mlp`) gives the same layer as the saved per-expert tensors."""
    model = tiny[name]
    prefix = f"model.layers.{model.layer}.mlp."
    mlp = model.model.model.layers[model.layer].mlp
    tensors = {prefix + k: v.contiguous() for k, v in mlp.state_dict().items()}
    assert prefix + "experts.gate_up_proj" in tensors
    save_file(tensors, tmp_path / "model.safetensors")
    x = torch.randn(5, HIDDEN)
    torch.testing.assert_close(model.build(tmp_path)(x), model.build()(x), rtol=0, atol=0)


def test_each_expert_runs_at_most_once_per_call(
    tiny: dict[str, Tiny], monkeypatch: pytest.MonkeyPatch
) -> None:
    """33 tokens x 4 slots over 6 experts: every expert's gate/up is called once, on all of its
    rows (the shared expert once, on all tokens)."""
    calls: list[tuple[int, int]] = []  # (layer id, rows) per call

    class Counting(SwiGLU):
        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            calls.append((id(self), int(x.shape[0])))
            return super().__call__(x)

    monkeypatch.setattr(moe, "SwiGLU", Counting)
    mlp = tiny["qwen2"].build()
    mlp(torch.randn(33, HIDDEN))
    layers = [layer for layer, _ in calls]
    assert len(layers) == len(set(layers)) <= 6 + 1
    assert sum(rows for _, rows in calls) == 33 * 4 + 33


class QuantizedSource:
    """A saved folder whose expert and shared-expert weights are Q8_0 blocks, as a GGUF source
    gives them (`blocks`), or their dequantized float32 values (`tensor`), with `use_blocks`
    False: what the converted folder holds."""

    def __init__(self, folder: Path, *, use_blocks: bool) -> None:
        self._inner = SafetensorsSource(folder)
        self._use_blocks = use_blocks
        self._blocks: dict[str, Blocks] = {}
        self._floats: dict[str, torch.Tensor] = {}
        for name in self._inner.names():
            if ".experts." in name or ".shared_expert." in name:
                weight = self._inner.tensor(name).float().numpy()
                raw = quants.quantize(weight, GGMLQuantizationType.Q8_0)
                self._blocks[name] = Blocks(Q8_0, raw, int(weight.shape[1]))
                dequantized = quants.dequantize(raw, GGMLQuantizationType.Q8_0)
                self._floats[name] = torch.from_numpy(dequantized)

    def names(self) -> frozenset[str]:
        return self._inner.names()

    def tensor(self, name: str) -> torch.Tensor:
        return self._floats[name] if name in self._floats else self._inner.tensor(name)

    def blocks(self, name: str) -> Blocks | None:
        return self._blocks.get(name) if self._use_blocks else None


def test_gguf_blocks_give_their_float_conversion(
    tiny: dict[str, Tiny], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Experts whose weights the source gives as GGUF blocks run on them (GGUFSwiGLU /
    GGUFLinear): the layer of the dequantized weights, up to summation order."""
    built: list[int] = []

    class Spy(GGUFSwiGLU):
        def __init__(self, gate: Blocks, up: Blocks, dot: int) -> None:
            built.append(gate.n)
            super().__init__(gate, up, dot)

    monkeypatch.setattr(moe, "GGUFSwiGLU", Spy)
    model = tiny["qwen2"]
    layers = [
        build_moe(
            QuantizedSource(model.folder, use_blocks=use_blocks),
            model.layer,
            model.model.config,
            dtype=torch.float32,
            pack=True,
            kernel_config=dataclasses.replace(KERNELS, gguf_dot="float"),  # float32 products
        )
        for use_blocks in (True, False)
    ]
    assert sorted(built) == [32] * 6 + [64]  # the six experts and the shared one
    for rows in (1, 33):
        x = torch.randn(rows, HIDDEN)
        torch.testing.assert_close(layers[0](x), layers[1](x), rtol=1e-5, atol=1e-5)


def test_which_layers_are_sparse() -> None:
    from transformers import LlamaConfig, MixtralConfig, Qwen3MoeConfig

    qwen3 = Qwen3MoeConfig(num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3, 5])
    assert [is_moe_layer(qwen3, i) for i in range(7)] == [False, True] + [False] * 5
    no_experts = Qwen3MoeConfig(num_hidden_layers=2, num_experts=0)
    assert not any(is_moe_layer(no_experts, i) for i in range(2))
    mixtral = MixtralConfig(num_hidden_layers=3)
    assert [is_moe_layer(mixtral, i) for i in range(4)] == [True, True, True, False]
    assert not is_moe_layer(LlamaConfig(num_hidden_layers=2), 0)


def test_a_dense_layer_is_refused(tiny: dict[str, Tiny]) -> None:
    model = tiny["qwen3"]  # layer 0 is in mlp_only_layers
    with pytest.raises(ValueError, match="not a MoE layer"):
        build_moe(
            SafetensorsSource(model.folder),
            0,
            model.model.config,
            dtype=torch.float32,
            pack=False,
            kernel_config=KERNELS,
        )
