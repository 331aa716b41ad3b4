"""The kernels' spinning helper for decode steps (`kernels.team`, csrc/claim.h): inside a team
the claimed-work kernels give the same bits as outside, from several Python threads at once, and
in a process forked after the parent used its team."""

from __future__ import annotations

import multiprocessing
import threading

import pytest
import torch

from modelyard.runner import kernels

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _built() -> None:
    assert kernels.load(), "the native kernels did not build (see scripts/setup)"


def _gemm_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    weight, x = torch.randn(520, 96), torch.randn(32, 96)
    packed = kernels.pack_weight(weight)
    return packed, x, kernels.packed_linear(x, packed, 520, None)


def test_claimed_work_inside_a_team_gives_the_same_bits() -> None:
    packed, x, outside = _gemm_case()
    k_cache, v_cache = torch.randn(2, 9, 16, 64), torch.randn(2, 9, 16, 64)
    q, tables = torch.randn(4, 6, 64), torch.tensor([[1, 2], [3, 4], [5, 6], [7, 8]])
    lens = torch.tensor([1, 17, 32, 20])
    attn_outside = kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125, None)
    with kernels.team():
        for _ in range(200):  # many calls: the helper picks some up, and some not in time
            inside = kernels.packed_linear(x, packed, 520, None)
            torch.testing.assert_close(inside, outside, atol=0, rtol=0)
        attn_inside = kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125, None)
    torch.testing.assert_close(attn_inside, attn_outside, atol=0, rtol=0)
    # after the step: the ATen threads again
    torch.testing.assert_close(kernels.packed_linear(x, packed, 520, None), outside, atol=0, rtol=0)


def test_a_team_serves_several_python_threads() -> None:
    """One call at a time uses the helper; a call made meanwhile runs on ATen's threads."""
    packed, x, outside = _gemm_case()
    wrong: list[int] = []

    def work() -> None:
        for _ in range(100):
            if not torch.equal(kernels.packed_linear(x, packed, 520, None), outside):
                wrong.append(1)

    with kernels.team():
        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not wrong


def _child(
    packed: torch.Tensor,
    x: torch.Tensor,
    expected: torch.Tensor,
    queue: multiprocessing.Queue[bool],
) -> None:
    # only team calls: ATen's OpenMP pool does not survive a fork of a process that used it
    with kernels.team():
        same = all(
            torch.equal(kernels.packed_linear(x, packed, 520, None), expected) for _ in range(50)
        )
    queue.put(same)


def test_a_forked_process_gets_its_own_helper() -> None:
    """The parent's helper thread does not survive fork; the child's first team starts one."""
    packed, x, outside = _gemm_case()
    with kernels.team():
        kernels.packed_linear(x, packed, 520, None)
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[bool] = context.Queue()
    child = context.Process(target=_child, args=(packed, x, outside, queue))
    child.start()
    try:
        child.join(timeout=60)
        assert child.exitcode == 0
        assert queue.get(timeout=5) is True
    finally:
        if child.is_alive():
            child.kill()


def test_element_wise_passes_split_on_the_team_give_the_same_bits() -> None:
    """Inside a step the fused ops split even short passes into chunks for the helper."""
    torch.manual_seed(1)
    x, delta = (torch.randn(37, 576) * 3).bfloat16(), torch.randn(37, 576).bfloat16()
    w, both = torch.randn(576).bfloat16(), (torch.randn(37, 2 * 1536) * 4).bfloat16()

    def passes() -> list[torch.Tensor]:
        residual = x.clone()
        normed = kernels.add_rms_norm(residual, delta, w, 1e-5)
        return [residual, normed, kernels.rms_norm(x, w, 1e-5), kernels.silu_mul(both)]

    outside = passes()
    with kernels.team():
        inside = passes()
    for a, b in zip(inside, outside, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
