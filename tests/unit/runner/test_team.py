"""The kernels' spinning helper for decode steps (`kernels.team`, csrc/claim.h): it really takes
units; every unit runs once and errors reach the caller; inside a team the kernels give the same
bits as outside, from several Python threads at once, and in a process forked after the parent
used its team. Results inside a team are computed first, so that a skipped unit cannot hide
behind memory that still holds the right answer."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator

import pytest
import torch

from modelyard.engine.config import kernels_from_environment
from modelyard.runner import kernels
from modelyard.runner.models import rope

KERNELS = kernels_from_environment()  # the switches of this test run's environment

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _two_threads() -> Iterator[None]:
    """The team serves a 2-thread ATen pool; other tests (a runner's num_threads) may have set
    the process's thread count, so each test here sets 2 and puts the count back."""
    assert kernels.load(KERNELS), "the native kernels did not build (see scripts/setup)"
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _probe(units: int, fail: int = -1, unit_us: int = 0, run: int = 1) -> torch.Tensor:
    """(4, units): how often each unit ran, whether on the calling thread, whether on the
    team's helper, and the unit it was told its thread runs next."""
    out: torch.Tensor = torch.ops.modelyard_kernels.claim_probe(units, fail, unit_us, run)
    return out


def _helper_takes_units() -> bool:
    """Whether units of ~50 us were split between the caller and the team's helper (tried a few
    times: on a busy host the helper may not get a core for a while)."""
    for _ in range(20):
        ran = _probe(64, unit_us=50)
        assert ran[0].tolist() == [1] * 64
        on_caller, on_helper = int(ran[1].sum()), int(ran[2].sum())
        assert on_caller + on_helper == 64
        if on_helper > 0:
            return True
    return False


@pytest.mark.parametrize("in_team", [False, True])
def test_each_unit_runs_once_and_an_error_reaches_the_caller(in_team: bool) -> None:
    """for_each_claimed's contract on both paths: every unit exactly once; an error raised by a
    unit, on whichever thread claimed it, is raised to the caller, and the next call works."""
    with kernels.team(in_team):
        for units in (1, 2, 7, 64, 1000):
            assert _probe(units)[0].tolist() == [1] * units
        if in_team:
            assert _helper_takes_units()
        else:
            assert int(_probe(64, unit_us=50)[2].sum()) == 0  # ATen's threads, not the helper
        failed_elsewhere = 0
        for attempt in range(200):
            fail = attempt % 16
            with pytest.raises(RuntimeError, match=f"claim_probe: unit {fail} failed"):
                _probe(16, fail, 50)
            ran = _probe(16, unit_us=50)
            assert ran[0].tolist() == [1] * 16
            failed_elsewhere += int(ran[1][fail]) == 0
            if failed_elsewhere >= 3 and attempt >= 32:
                break
        assert failed_elsewhere > 0  # some failing units ran on the other thread


@pytest.mark.parametrize("in_team", [False, True])
@pytest.mark.parametrize(("units", "run"), [(1, 4), (7, 4), (64, 16), (1000, 16), (1001, 3)])
def test_units_claimed_in_runs(in_team: bool, units: int, run: int) -> None:
    """for_each_claimed_in_runs: every unit exactly once; inside a run a unit's `following` is
    the next unit, and a run's last unit is told the first of the thread's next run (or
    `units`), so each thread's units, followed from its first, chain through exactly the units
    it ran."""
    with kernels.team(in_team):
        ran = _probe(units, unit_us=2, run=run)
    assert ran[0].tolist() == [1] * units
    following = ran[3].tolist()
    for unit in range(units):
        if (unit + 1) % run and unit + 1 < units:
            assert following[unit] == unit + 1
        else:
            assert following[unit] > unit
            assert following[unit] == units or following[unit] % run == 0
    on_caller = ran[1].tolist()
    heads = set(range(units)) - set(following)  # each thread's first unit
    for head in heads:
        unit, chain = head, []
        while unit < units:
            chain.append(unit)
            unit = following[unit]
        assert len({on_caller[u] for u in chain}) == 1  # one thread's units
    assert len(heads) <= 2  # two threads at most


def _gemm_case() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    weight, x = torch.randn(520, 96), torch.randn(32, 96)
    return kernels.pack_weight(weight), x


def test_claimed_work_inside_a_team_gives_the_same_bits() -> None:
    packed, x = _gemm_case()
    k_cache, v_cache = torch.randn(2, 9, 16, 64), torch.randn(2, 9, 16, 64)
    q, tables = torch.randn(4, 6, 64), torch.tensor([[1, 2], [3, 4], [5, 6], [7, 8]])
    lens = torch.tensor([1, 17, 32, 20])
    with kernels.team():
        inside = [kernels.packed_linear(x, packed, 520, None) for _ in range(50)]
        attn_inside = kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125, None)
    outside = kernels.packed_linear(x, packed, 520, None)
    for out in inside:
        torch.testing.assert_close(out, outside, atol=0, rtol=0)
    attn_outside = kernels.paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125, None)
    torch.testing.assert_close(attn_inside, attn_outside, atol=0, rtol=0)


def test_a_team_serves_several_python_threads() -> None:
    """One call at a time uses the helper; a call made meanwhile runs on ATen's threads."""
    packed, x = _gemm_case()
    results: list[torch.Tensor] = []

    def work() -> None:
        results.extend(kernels.packed_linear(x, packed, 520, None) for _ in range(100))

    with kernels.team():
        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    expected = kernels.packed_linear(x, packed, 520, None)
    assert len(results) == 300
    assert all(torch.equal(r, expected) for r in results)


def _element_wise(dtype: torch.dtype) -> list[torch.Tensor]:
    """The fused passes of a decode step on 37 rows: norms, residual add, SwiGLU's activation
    (bf16), RoPE + KV-cache write."""
    torch.manual_seed(1)
    x, delta = (torch.randn(37, 576) * 3).to(dtype), torch.randn(37, 576).to(dtype)
    w = torch.randn(576).to(dtype)
    residual = x.clone()
    out = [kernels.add_rms_norm(residual, delta, w, 1e-5), residual, kernels.rms_norm(x, w, 1e-5)]
    if dtype == torch.bfloat16:
        out.append(kernels.silu_mul((torch.randn(37, 2 * 1536) * 4).bfloat16()))
    nh, nkv, hd = 9, 3, 64
    config = type("Config", (), {"rope_parameters": {"rope_theta": 10000.0}})()
    cos, sin = rope.rotary_tables(config, "", hd, dtype, 64)
    qkv = torch.randn(37, (nh + 2 * nkv) * hd).to(dtype)
    k_cache, v_cache = (
        torch.zeros(nkv, 10, 4, hd, dtype=dtype),
        torch.zeros(nkv, 10, 4, hd, dtype=dtype),
    )
    positions, slots = torch.arange(37) % 64, torch.randperm(40)[:37]
    kernels.rope_store(qkv, cos, sin, positions, k_cache, v_cache, slots, nh)
    return [*out, qkv, k_cache, v_cache]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_element_wise_passes_split_on_the_team_give_the_same_bits(dtype: torch.dtype) -> None:
    """Inside a step the fused ops split even short passes into chunks for the helper."""
    with kernels.team():
        inside = _element_wise(dtype)
    outside = _element_wise(dtype)
    for a, b in zip(inside, outside, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def _child(queue: multiprocessing.Queue[bool]) -> None:
    # only team calls: ATen's OpenMP pool does not survive a fork of a process that used it
    with kernels.team():
        queue.put(_helper_takes_units())


def test_a_forked_process_gets_its_own_helper() -> None:
    """The parent's helper thread does not survive fork; the child's first team starts its own,
    which takes units."""
    with kernels.team():
        assert _helper_takes_units()
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[bool] = context.Queue()
    child = context.Process(target=_child, args=(queue,))
    child.start()
    try:
        child.join(timeout=60)
        assert child.exitcode == 0
        assert queue.get(timeout=5) is True
    finally:
        if child.is_alive():
            child.kill()
