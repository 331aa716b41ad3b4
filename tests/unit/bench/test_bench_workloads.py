from __future__ import annotations

import itertools
import json
import random
import statistics
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from modelyard.bench.cli import point_seed, sweep_points
from modelyard.bench.client import EndpointConfig
from modelyard.bench.loadgen import ArrivalConfig, arrival_offsets, run_load
from modelyard.bench.workloads import LengthDist, Workload, WorkloadConfig

pytestmark = pytest.mark.unit


def test_length_distributions() -> None:
    rng = random.Random(0)
    assert LengthDist.parse("64").sample(rng) == 64
    u = LengthDist.parse("uniform:10,20")
    xs = [u.sample(rng) for _ in range(500)]
    assert min(xs) == 10
    assert max(xs) == 20
    n = LengthDist.parse("normal:100,10")
    ys = [n.sample(rng) for _ in range(2000)]
    assert statistics.mean(ys) == pytest.approx(100, abs=1.5)
    assert statistics.stdev(ys) == pytest.approx(10, abs=1.5)
    for bad in ("uniform:5", "gamma:1,2", "normal:a,b", "uniform:9,3", "0"):
        with pytest.raises(ValueError):
            LengthDist.parse(bad)


def test_workload_is_seeded_and_hits_target_lengths() -> None:
    cfg = WorkloadConfig(
        input_len=LengthDist.parse("uniform:5,50"), output_len=LengthDist.parse("7")
    )
    a = [s for s, _ in zip(Workload(cfg), range(20), strict=False)]
    b = [s for s, _ in zip(Workload(cfg), range(20), strict=False)]
    assert a == b
    for spec in a:
        assert len(spec.prompt.split()) == spec.prompt_tokens
        assert spec.max_tokens == 7
    assert len({s.prompt for s in a}) == 20


def test_every_sweep_point_and_seed_draws_prompts_of_its_own() -> None:
    """A sweep resends no prompt: each point's workload has its own seed, and runs with other
    seeds (one per server compared) share none either, so no prefix cache serves them."""
    cfg = WorkloadConfig(input_len=LengthDist.parse("64"), output_len=LengthDist.parse("8"))
    seeds = {point_seed(seed, index) for seed in range(4) for index in range(6)}
    assert len(seeds) == 24
    firsts = set()
    for seed in seeds:
        prompts = [
            s.prompt for s, _ in zip(Workload(replace(cfg, seed=seed)), range(8), strict=False)
        ]
        firsts.update(p[:60] for p in prompts)
    assert len(firsts) == 24 * 8


def test_tokenizer_prompts_have_exact_token_lengths() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from modelyard.bench.workloads import _WORDS

    vocab = {w: i for i, w in enumerate(["[UNK]", *sorted(set(_WORDS))])}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")
    cfg = WorkloadConfig(input_len=LengthDist.parse("33"), output_len=LengthDist.parse("4"))
    for spec, _ in zip(Workload(cfg, tok), range(5), strict=False):
        assert spec.prompt_tokens == 33
        assert len(tok.encode(spec.prompt, add_special_tokens=False)) == 33


def test_dataset_rows_cycle(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(
        json.dumps({"prompt": "a b c", "output_len": 3})
        + "\n\n"
        + json.dumps({"prompt": "d"})
        + "\n"
    )
    cfg = WorkloadConfig(LengthDist.parse("1"), LengthDist.parse("9"), dataset=str(path))
    specs = [s for s, _ in zip(Workload(cfg), range(3), strict=False)]
    assert [(s.prompt, s.max_tokens, s.prompt_tokens) for s in specs] == [
        ("a b c", 3, 3), ("d", 9, 1), ("a b c", 3, 3),
    ]  # fmt: skip
    path.write_text('{"text": 1}\n')
    with pytest.raises(ValueError):
        Workload(cfg)


def test_arrival_offsets() -> None:
    poisson = ArrivalConfig(mode="poisson", rate=20.0, seed=1)
    offs = [t for t, _ in zip(arrival_offsets(poisson), range(4001), strict=False)]
    gaps = [b - a for a, b in itertools.pairwise(offs)]
    assert statistics.mean(gaps) == pytest.approx(1 / 20, rel=0.06)
    burst = ArrivalConfig(mode="burst", burst_size=3, burst_interval_s=0.5)
    assert [t for t, _ in zip(arrival_offsets(burst), range(7), strict=False)] == [
        0,
        0,
        0,
        0.5,
        0.5,
        0.5,
        1.0,
    ]
    assert [p.concurrency for p in sweep_points("concurrency=1,2,8", ArrivalConfig())] == [1, 2, 8]
    with pytest.raises(ValueError):
        ArrivalConfig(num_requests=None, duration_s=None)


async def _count_in_flight(arrivals: ArrivalConfig) -> tuple[int, int, float]:
    in_flight = peak = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        import asyncio

        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1
        return httpx.Response(200, json={"predictions": [0]})

    endpoint = EndpointConfig(base_url="http://fake", model="m", endpoint="predict")
    cfg = WorkloadConfig(LengthDist.parse("3"), LengthDist.parse("3"))
    import modelyard.bench.loadgen as lg

    real = lg.httpx.AsyncClient
    lg.httpx.AsyncClient = lambda **kw: real(transport=httpx.MockTransport(handler), **kw)  # type: ignore[assignment,misc]
    try:
        t = time.perf_counter()
        run = await run_load(endpoint, arrivals, iter(Workload(cfg)))
        return len(run.results), peak, time.perf_counter() - t
    finally:
        lg.httpx.AsyncClient = real  # type: ignore[misc]


async def test_closed_loop_keeps_concurrency_and_stops_by_count() -> None:
    n, peak, _ = await _count_in_flight(ArrivalConfig(concurrency=4, num_requests=20, warmup=2))
    assert n == 20
    assert peak == 4


async def test_runs_stop_by_duration_and_bursts_arrive_together() -> None:
    n, _, took = await _count_in_flight(
        ArrivalConfig(concurrency=2, num_requests=None, duration_s=0.2)
    )
    assert took < 0.5
    assert 10 <= n <= 22
    burst = ArrivalConfig(
        mode="burst", concurrency=0, burst_size=5, burst_interval_s=0.1, num_requests=10
    )
    n, peak, _ = await _count_in_flight(burst)
    assert n == 10
    assert peak == 5
