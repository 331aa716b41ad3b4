"""Gateway cost per request: auth + authorize + route + rate limit + usage, against the gateway
switched off.

Runs in-process through ASGI (no sockets, no HTTP parsing: only the gateway's own work differs
between variants). A minimal model route reads the body and goes through the real request path
(gateway/request_path.py) over a provider whose leases cost nothing, reports token counts and
answers a small JSON. Variants:
- off:         no middleware, the router called directly, IdentityRouter;
- memory:      API key (SQLite store, default 2 s lookup cache), rpm+tpm limits in memory,
               weighted router with a 10 % canary;
- memory-jwt:  the same with an RS256 JWT instead of an API key (JWKS file);
- redis:       API key, limits in a real redis-server (two Lua calls per request: acquire and
               settle the real token count), weighted router;
- redis-rpm-only: rpm limit only (one Lua call per request: nothing to settle);
- redis-ping:  a bare PING round trip to the same redis-server (the floor of any Redis store).
Reports p50/p99 per request (microseconds) and the overhead over `off`; writes
benchmarks/results/gateway_overhead.json. Targets: <= 1 ms p50 overhead in memory, <= 2 ms Redis.

    .venv/bin/python benchmarks/gateway_overhead.py [--requests 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelyard.gateway.base import ANONYMOUS, IdentityRouter, ModelRouter
from modelyard.gateway.config import GatewayConfig
from modelyard.gateway.gateway import Gateway, build_gateway
from modelyard.gateway.keys import SqliteKeyStore, new_record
from modelyard.gateway.middleware import build_gateway_middleware
from modelyard.gateway.request_path import Demand, RequestPath
from modelyard.gateway.router import build_router
from modelyard.gateway.ticket import TICKET_SCOPE_KEY
from modelyard.manager.base import Lease
from modelyard.model_spec import ModelKind, ModelSpec

sys.path.insert(0, str(Path(__file__).parent))
from common import machine_info, results_dir

RESULTS = results_dir() / "gateway_overhead.json"
BODY = json.dumps(
    {"model": "chat", "messages": [{"role": "user", "content": "Hello there!"}], "max_tokens": 16}
).encode()
ROUTES = {"models": {"chat": {"target": "chat-v1", "canary": {"chat-v2": 0.1}}}, "seed": 1}


class FreeLease:
    """A lease of a chat model that costs nothing."""

    def __init__(self, name: str) -> None:
        self.model_id, self.kind = name, ModelKind.CHAT
        self.llm: Any = None
        self.predictor: Any = None
        self.metadata: dict[str, Any] = {}


class FreeModels:
    """Every name is a loaded chat model."""

    def spec(self, name: str) -> ModelSpec:
        return ModelSpec(id=name, kind=ModelKind.CHAT)

    @contextlib.asynccontextmanager
    async def lease(self, name: str) -> AsyncIterator[FreeLease]:
        yield FreeLease(name)

    def describe(self) -> dict[str, Any]:
        return {}

    async def close(self) -> None:
        return None


def make_handler(router: ModelRouter, config: GatewayConfig) -> ASGIApp:
    path = RequestPath(FreeModels(), router, timeout_s=60)  # type: ignore[arg-type]

    async def start(lease: Lease) -> None:
        return None

    async def handler(scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        body = await request.body()
        model = json.loads(body)["model"]
        if TICKET_SCOPE_KEY in scope:  # the gateway is on: the whole request path
            demand = Demand.generation(
                config.rate_limit, body_bytes=len(body), max_tokens=16, sequences=1
            )
            served = await path.open_llm(request, model, demand, start)
            served.record_tokens(12, 16)
            await served.aclose()
            target = served.model_id
        else:
            target = router.route(model, ANONYMOUS).targets[0]
        payload = json.dumps({"model": target}).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    return handler


def wrap(app: ASGIApp, config: GatewayConfig, gateway: Gateway) -> ASGIApp:
    for middleware in reversed(build_gateway_middleware(config, gateway=gateway)):
        cls, args, kwargs = middleware
        app = cls(app, *args, **kwargs)
    return app


async def measure(
    app: ASGIApp, headers: list[tuple[bytes, bytes]], n: int, warmup: int
) -> list[float]:
    scope_base = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(BODY)).encode()),
            *headers,
        ],
    }
    samples: list[float] = []
    statuses: set[int] = set()

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            statuses.add(message["status"])

    for i in range(warmup + n):
        delivered = False

        async def receive() -> Message:
            nonlocal delivered
            if delivered:
                await asyncio.sleep(3600)
            delivered = True
            return {"type": "http.request", "body": BODY, "more_body": False}

        scope = dict(scope_base)
        started = time.perf_counter_ns()
        await app(scope, receive, send)
        elapsed = (time.perf_counter_ns() - started) / 1000.0
        if i >= warmup:
            samples.append(elapsed)
    if statuses != {200}:
        raise RuntimeError(f"unexpected statuses {statuses}")
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_us": round(statistics.median(ordered), 1),
        "p99_us": round(ordered[int(len(ordered) * 0.99) - 1], 1),
        "mean_us": round(statistics.fmean(ordered), 1),
    }


def start_redis() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    binary = shutil.which("redis-server") or "redis-server"
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return process, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("redis-server did not start")


async def redis_ping(url: str, n: int, warmup: int) -> list[float]:
    """Round-trip time of a bare PING with the same client settings: the machine's floor."""
    from modelyard.gateway.redis_store import make_client

    client = make_client(url, 0.25)
    samples = []
    try:
        for i in range(warmup + n):
            started = time.perf_counter_ns()
            await client.ping()
            if i >= warmup:
                samples.append((time.perf_counter_ns() - started) / 1000.0)
    finally:
        await client.aclose()
    return samples


def jwt_setup(tmp: Path) -> tuple[dict[str, Any], str]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
    jwk.update(kid="bench", alg="RS256")
    (tmp / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    now = int(time.time())
    claims = {"tenant": "acme", "aud": "modelyard", "iss": "bench", "exp": now + 3600, "iat": now}
    token = jwt.encode(claims, private, algorithm="RS256", headers={"kid": "bench"})
    section = {"jwks_file": str(tmp / "jwks.json"), "audience": "modelyard", "issuer": "bench"}
    return section, token


async def run_variant(
    section: dict[str, Any], headers: list[tuple[bytes, bytes]], n: int, warmup: int
) -> list[float]:
    config = GatewayConfig.from_dict(section)
    gateway = build_gateway(config)
    try:
        app = wrap(make_handler(build_router(config), config), config, gateway)
        return await measure(app, headers, n, warmup)
    finally:
        await gateway.close()


async def main(n: int, warmup: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="gw-bench-"))
    db = tmp / "keys.db"
    key, record = new_record("acme", rpm=10**9, tpm=10**12)
    SqliteKeyStore(db).add(record)
    key_headers = [(b"authorization", f"Bearer {key}".encode())]
    base = {"keys": {"sqlite_path": str(db)}, "routes": ROUTES}
    jwt_section, token = jwt_setup(tmp)
    results: dict[str, Any] = {}
    off = make_handler(IdentityRouter(), GatewayConfig())
    results["off"] = summary(await measure(off, [], n, warmup))
    results["memory"] = summary(await run_variant(base, key_headers, n, warmup))
    jwt_config = {
        **base,
        "jwt": jwt_section,
        "tenants": {"acme": {"rpm": 10**9, "tpm": 10**12}},
    }
    results["memory-jwt"] = summary(
        await run_variant(jwt_config, [(b"authorization", f"Bearer {token}".encode())], n, warmup)
    )
    redis_process, url = start_redis()
    try:
        results["redis-ping"] = summary(await redis_ping(url, n, warmup))
        redis_section = {**base, "redis_url": url, "rate_limit": {"store": "redis"}}
        results["redis"] = summary(await run_variant(redis_section, key_headers, n, warmup))
        rpm_key, rpm_record = new_record("acme-rpm", rpm=10**9)
        SqliteKeyStore(db).add(rpm_record)
        rpm_headers = [(b"authorization", f"Bearer {rpm_key}".encode())]
        results["redis-rpm-only"] = summary(
            await run_variant(redis_section, rpm_headers, n, warmup)
        )
    finally:
        redis_process.kill()
        redis_process.wait()
    off = results["off"]
    for name, figures in results.items():
        if name not in ("off", "redis-ping"):
            figures["overhead_p50_us"] = round(figures["p50_us"] - off["p50_us"], 1)
            figures["overhead_p99_us"] = round(figures["p99_us"] - off["p99_us"], 1)
    return {
        "benchmark": "gateway_overhead",
        "requests_per_variant": n,
        "warmup": warmup,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),  # shared machines: context
        "targets_us": {"memory_p50_overhead": 1000, "redis_p50_overhead": 2000},
        "variants": results,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=300)
    args = parser.parse_args()
    report = {"machine": machine_info(), **asyncio.run(main(args.requests, args.warmup))}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'variant':<12} {'p50 us':>9} {'p99 us':>9} {'+p50 us':>9} {'+p99 us':>9}")
    for name, f in report["variants"].items():
        print(
            f"{name:<12} {f['p50_us']:>9} {f['p99_us']:>9} "
            f"{f.get('overhead_p50_us', 0):>9} {f.get('overhead_p99_us', 0):>9}"
        )
    print(f"written to {RESULTS}")
