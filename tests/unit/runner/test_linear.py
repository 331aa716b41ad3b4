"""The runner's Linear: oneDNN-packed float32 weights give F.linear's result (up to summation
order), at decode and prefill row counts, with and without bias; other dtypes are not packed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from modelyard.runner.linear import Linear, packing_available

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("rows", [1, 7, 32, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_matches_f_linear(rows: int, with_bias: bool) -> None:
    assert packing_available(torch.float32), "oneDNN packing is expected on this CPU build"
    torch.manual_seed(rows)
    weight, x = torch.randn(96, 40), torch.randn(rows, 40)
    bias = torch.randn(96) if with_bias else None
    layer = Linear(weight, bias, pack=True)
    torch.testing.assert_close(layer(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    assert layer.out_features == 96
    # a non-contiguous input (a transposed view) gives the same result
    torch.testing.assert_close(layer(x.t().contiguous().t()), layer(x), rtol=0, atol=0)


def test_bfloat16_is_not_packed_and_unpacked_is_exact() -> None:
    assert not packing_available(torch.bfloat16)
    weight, x = torch.randn(8, 4, dtype=torch.bfloat16), torch.randn(3, 4, dtype=torch.bfloat16)
    torch.testing.assert_close(
        Linear(weight, None, pack=False)(x), F.linear(x, weight), rtol=0, atol=0
    )


def test_packing_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELYARD_PACKED_LINEAR", "0")
    assert not packing_available(torch.float32)
