"""The load generator: arrival processes, warm-up, bounded runs, a live progress bar.

Arrivals:
- `closed`: N workers, each sends its next request as soon as its previous one finished
  (concurrency N, the usual "c=N" of serving benchmarks);
- `poisson`: open loop, exponential gaps at `rate` requests/s (optionally capped in flight by
  `max_concurrency`): queueing shows up as it does with real users;
- `burst`: open loop, `burst_size` requests at once every `burst_interval` seconds.

A run stops by itself: after `num_requests` requests, or after `duration_s` seconds of issuing
(requests in flight then finish, each bounded by the per-request timeout). `warmup` requests are
sent first at the same concurrency and not measured.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx

from modelyard.bench.client import EndpointConfig, RequestResult, send
from modelyard.bench.workloads import RequestSpec


@dataclass(frozen=True, slots=True)
class ArrivalConfig:
    """When requests are sent and when the run stops."""

    mode: str = "closed"  # closed | poisson | burst
    concurrency: int = 1  # closed: workers; poisson/burst: max in flight (0 = unbounded)
    rate: float = 1.0  # poisson: requests per second
    burst_size: int = 8  # burst: requests per burst
    burst_interval_s: float = 1.0  # burst: seconds between bursts
    num_requests: int | None = 100  # stop after this many (None: by duration)
    duration_s: float | None = None  # stop issuing after this many seconds
    warmup: int = 0  # unmeasured requests sent first
    seed: int = 0  # Poisson gaps

    def __post_init__(self) -> None:
        if self.mode not in ("closed", "poisson", "burst"):
            raise ValueError("arrival mode must be closed|poisson|burst")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("give a request count or a duration")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError("num_requests must be >= 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("duration must be > 0")
        if self.concurrency < (1 if self.mode == "closed" else 0):
            raise ValueError("concurrency must be >= 1 (closed loop) or >= 0")
        if self.rate <= 0 or self.burst_size < 1 or self.burst_interval_s <= 0 or self.warmup < 0:
            raise ValueError("rate, burst size and burst interval must be positive")


@dataclass(slots=True)
class RunResult:
    """The measured requests of one run."""

    results: list[RequestResult] = field(default_factory=list)  # in completion order
    duration_s: float = 0.0  # first send -> last completion


Progress = Callable[[RequestResult], None]


class _Budget:
    """Hands out the next request while the run may still issue one."""

    def __init__(self, specs: Iterator[RequestSpec], cfg: ArrivalConfig, t0: float) -> None:
        self.specs, self.cfg, self.t0, self.issued = specs, cfg, t0, 0

    def next(self) -> RequestSpec | None:
        if self.cfg.num_requests is not None and self.issued >= self.cfg.num_requests:
            return None
        if self.cfg.duration_s is not None and time.perf_counter() - self.t0 >= self.cfg.duration_s:
            return None
        self.issued += 1
        return next(self.specs)


async def run_load(
    endpoint: EndpointConfig,
    arrivals: ArrivalConfig,
    specs: Iterator[RequestSpec],
    progress: Progress | None = None,
) -> RunResult:
    """Warm up, then run the measured phase; never raises for server behaviour."""
    limit = arrivals.concurrency if arrivals.concurrency > 0 else None
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    async with httpx.AsyncClient(limits=limits, timeout=endpoint.timeout_s) as client:
        if arrivals.warmup:
            warm = ArrivalConfig(
                concurrency=max(1, min(arrivals.warmup, arrivals.concurrency or 1)),
                num_requests=arrivals.warmup,
            )
            await _closed_loop(client, endpoint, warm, specs, RunResult(), None)
        run = RunResult()
        t0 = time.perf_counter()
        if arrivals.mode == "closed":
            await _closed_loop(client, endpoint, arrivals, specs, run, progress, t0)
        else:
            await _open_loop(client, endpoint, arrivals, specs, run, progress, t0)
        run.duration_s = time.perf_counter() - t0
    return run


async def _closed_loop(
    client: httpx.AsyncClient,
    endpoint: EndpointConfig,
    cfg: ArrivalConfig,
    specs: Iterator[RequestSpec],
    run: RunResult,
    progress: Progress | None,
    t0: float | None = None,
) -> None:
    start = time.perf_counter() if t0 is None else t0
    budget = _Budget(specs, cfg, start)

    async def worker() -> None:
        while (spec := budget.next()) is not None:
            result = await send(client, endpoint, spec, start)
            run.results.append(result)
            if progress:
                progress(result)

    await asyncio.gather(*(worker() for _ in range(cfg.concurrency)))


def arrival_offsets(cfg: ArrivalConfig) -> Iterator[float]:
    """Send times in seconds after the run start (endless; the budget stops the run)."""
    rng = random.Random(cfg.seed)
    t = 0.0
    k = 0
    while True:
        if cfg.mode == "poisson":
            yield t
            t += rng.expovariate(cfg.rate)
        else:
            yield (k // cfg.burst_size) * cfg.burst_interval_s
            k += 1


async def _open_loop(
    client: httpx.AsyncClient,
    endpoint: EndpointConfig,
    cfg: ArrivalConfig,
    specs: Iterator[RequestSpec],
    run: RunResult,
    progress: Progress | None,
    t0: float,
) -> None:
    budget = _Budget(specs, cfg, t0)
    gate = asyncio.Semaphore(cfg.concurrency) if cfg.concurrency > 0 else None
    tasks: set[asyncio.Task[None]] = set()

    async def one(spec: RequestSpec) -> None:
        if gate is None:
            result = await send(client, endpoint, spec, t0)
        else:
            async with gate:
                result = await send(client, endpoint, spec, t0)
        run.results.append(result)
        if progress:
            progress(result)

    for offset in arrival_offsets(cfg):
        if cfg.duration_s is not None and offset >= cfg.duration_s:
            break
        delay = t0 + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        spec = budget.next()
        if spec is None:
            break
        task = asyncio.create_task(one(spec))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
