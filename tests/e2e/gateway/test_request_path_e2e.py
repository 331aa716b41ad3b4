"""The hostile-tenant walk through real `modelyard serve` processes: the embedded default catalog
(plus one model whose weights are missing), real keys, a real Redis shared by two servers.

- every model route x {no key 401, unknown key 401, model outside the allow-list 403, allowed
  200 with `x-modelyard-route` naming the model that served};
- repository load/unload: a tenant key gets 403 and the model stays loaded; an admin key works;
- routing on /v1/embeddings and /predict (alias, a canary split over 240 requests against a
  binomial bound, a tenant override, a fallback after the primary fails to load), each in the
  header and in the per-tenant usage metric;
- items per minute on /v1/embeddings: 429 with Retry-After and X-RateLimit-*, one limit for
  both servers;
- what a tenant sees: /models, /v1/models, the repository index, /metrics;
- allow-lists by every name: a key with `models: [smollm2]` calls the id, `default-chat` and the
  textbook routes, and /v1/models shows it exactly that model;
- pins between tenants: each tenant pins at most its share of the pin budget (507), and
  /v1/prefixes shows a narrow key only its models' budgets;
- `cache_salt`: differently salted requests share no cached tokens, equal salts do, as OpenAI's
  `usage.prompt_tokens_details.cached_tokens` reports.
One module, two servers (the second starts without preloading and serves only embeddings).
"""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_server import ServerProcess, start_server, stop_server
from gw_redis import RedisServer

from modelyard.gateway.keys import SqliteKeyStore, new_record
from modelyard.manager.catalog import DEFAULT_CATALOG_PATH

# the first test also starts both servers (the LLM is preloaded): more than the default 300 s
# on a loaded 2-core machine
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

LLM, EMBEDDER, ONNX_EMBEDDER, ZERO_SHOT = (
    "smollm2-135m-instruct",
    "all-minilm-l6-v2",
    "minilm-int8-onnx",
    "minilm-zero-shot",
)
BROKEN = """
  - id: broken-embedder
    kind: embedding
    backend: embeddings
    source: /nonexistent/embedder
    description: Weights that are not there (the fallback test's primary).
"""
CANARY_SHARE, CANARY_REQUESTS = 0.25, 240


@dataclass
class Walk:
    servers: list[ServerProcess]  # two `modelyard serve` processes, one Redis, one key file
    keys: dict[str, str]  # name -> API key
    seed: int  # the canary RNG seed of this run

    @property
    def url(self) -> str:
        return self.servers[0].url

    def auth(self, name: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.keys[name]}"}


def _keys(db: Path) -> dict[str, str]:
    store = SqliteKeyStore(db)
    specs: dict[str, dict[str, Any]] = {
        "acme": {"tenant": "acme", "models": (LLM, EMBEDDER, ZERO_SHOT)},
        "embed-only": {"tenant": "acme", "models": (EMBEDDER,)},
        "ops": {"tenant": "ops"},
        "beta": {"tenant": "beta"},
        "bulk": {"tenant": "bulk", "ipm": 10},
        "smollm2-only": {"tenant": "solo", "models": ("smollm2",)},
        "pin-a": {"tenant": "pin-a"},
        "pin-b": {"tenant": "pin-b"},
    }
    keys = {}
    for name, spec in specs.items():
        key, record = new_record(spec.pop("tenant"), **spec)
        store.add(record)
        keys[name] = key
    command = [sys.executable, "-m", "modelyard.cli", "keys", "--db", str(db), "create"]
    made = subprocess.run(  # the admin key as an operator makes it
        [*command, "--json", "--tenant", "ops", "--admin"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    keys["admin"] = json.loads(made.stdout)["key"]
    return keys


def _config(redis_url: str, db: Path, seed: int) -> str:
    routes = {
        "seed": seed,
        "models": {
            "embed": {"target": EMBEDDER, "canary": {ONNX_EMBEDDER: CANARY_SHARE}},
            "embed-tenant": {
                "target": EMBEDDER,
                "aliases": ["tenant-embedder"],
                "tenants": {"beta": ONNX_EMBEDDER},
            },
            "embed-safe": {"target": "broken-embedder", "fallbacks": [EMBEDDER]},
            "classify": {"target": ZERO_SHOT, "aliases": ["topic"]},
        },
    }
    gateway = {
        "redis_url": redis_url,
        "keys": {"sqlite_path": str(db), "cache_ttl_s": 0},
        "rate_limit": {"store": "redis", "on_store_error": "closed"},
        "routes": routes,
        "pins": {"share": 0.05},  # 18 of the chat model's 364 pinnable blocks per tenant
    }
    manager = {"retry_backoff_s": 60.0}  # the broken model is not retried during the module
    return yaml.safe_dump({"gateway": gateway, "manager": manager})


@pytest.fixture(scope="module")
def walk(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walk]:
    tmp = tmp_path_factory.mktemp("request-path")
    seed = random.SystemRandom().randrange(2**31)
    keys = _keys(tmp / "keys.db")
    config = _config(redis_server.url, tmp / "keys.db", seed)
    catalog = DEFAULT_CATALOG_PATH.read_text() + BROKEN
    servers: list[ServerProcess] = []
    try:
        for name, extra in (("one", ()), ("two", ("--no-preload",))):
            folder = tmp / name
            folder.mkdir()
            servers.append(start_server(folder, *extra, config=config, catalog_yaml=catalog))
        yield Walk(servers, keys, seed)
    finally:
        for server in servers:
            stop_server(server)


def _routes(model: str) -> list[tuple[str, dict[str, Any]]]:
    """(path, body) of the generation routes asking for `model`."""
    short = {"max_tokens": 2, "temperature": 0}
    chat = [{"role": "user", "content": "Say hi."}]
    return [
        ("/v1/chat/completions", {"model": model, "messages": chat, **short}),
        ("/v1/completions", {"model": model, "prompt": "Hello", **short}),
        ("/basic_generate", {"model": model, "prompt": "Hello", **short}),
        ("/generate", {"model": model, "prompts": ["Hello", "Bye"], **short}),
        ("/generate_stream", {"model": model, "prompt": "Hello", **short}),
    ]


def _model_routes(model: str) -> list[tuple[str, dict[str, Any]]]:
    """(path, body) of the other model routes asking for `model`."""
    texts = ["The match went to penalties.", "Parliament passed the budget."]
    v2 = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": texts}]}
    return [
        ("/v1/embeddings", {"model": model, "input": texts}),
        ("/predict", {"model_id": model, "input_data": texts}),
        (f"/v2/models/{model}/infer", v2),
    ]


def _post(walk: Walk, path: str, body: dict[str, Any], key: str | None) -> httpx.Response:
    headers = walk.auth(key) if key in walk.keys else {}
    if key == "unknown":
        headers = {"authorization": "Bearer my-" + "Q" * 43}
    return httpx.post(walk.url + path, json=body, headers=headers, timeout=300)


def _refused(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    if response.request.url.path.startswith("/v2/"):
        assert isinstance(error, str)  # the KServe envelope
        return error
    assert set(error) == {"message", "type", "param", "code"}  # the OpenAI envelope
    return str(error["code"])


def test_every_model_route_for_a_hostile_tenant(walk: Walk) -> None:
    cases = [(p, b, "embed-only", LLM) for p, b in _routes("smollm2")]
    cases += [(p, b, "acme", ONNX_EMBEDDER) for p, b in _model_routes(ONNX_EMBEDDER)]
    for path, body, narrow, _ in cases:
        assert _refused(_post(walk, path, body, None), 401), path
        assert _refused(_post(walk, path, body, "unknown"), 401), path
        outside = _post(walk, path, body, narrow)
        assert "not allowed" in outside.text, path
        _refused(outside, 403)
    allowed = [(p, b, "smollm2", LLM) for p, b in _routes("smollm2")]
    allowed += [(p, b, EMBEDDER, EMBEDDER) for p, b in _model_routes(EMBEDDER)[::2]]
    allowed += [(p, b, ZERO_SHOT, ZERO_SHOT) for p, b in _model_routes(ZERO_SHOT)[1:2]]
    for path, body, requested, served in allowed:
        ok = _post(walk, path, body, "acme")
        assert ok.status_code == 200, (path, ok.text)
        # the allow-list names the catalog id; the request used its alias
        assert ok.headers["x-modelyard-route"] == f"{requested}->{served};direct", path
    decoy = {"model": EMBEDDER, **_model_routes(ONNX_EMBEDDER)[2][1]}
    _refused(_post(walk, f"/v2/models/{ONNX_EMBEDDER}/infer", decoy, "acme"), 403)


def test_model_control_is_for_admins(walk: Walk) -> None:
    def ready(model: str) -> int:
        return httpx.get(
            f"{walk.url}/v2/models/{model}/ready", headers=walk.auth("acme")
        ).status_code

    _post(walk, "/v1/embeddings", {"model": EMBEDDER, "input": "x"}, "acme")  # loaded now
    assert ready(EMBEDDER) == 200
    for action in ("unload", "load"):
        refused = _post(walk, f"/v2/repository/models/{EMBEDDER}/{action}", {}, "acme")
        assert "admin" in _refused(refused, 403)
    assert ready(EMBEDDER) == 200  # one tenant cannot take a model away from the others
    assert _post(walk, f"/v2/repository/models/{EMBEDDER}/unload", {}, "admin").status_code == 200
    assert ready(EMBEDDER) == 400
    assert _post(walk, f"/v2/repository/models/{EMBEDDER}/load", {}, "admin").status_code == 200
    assert ready(EMBEDDER) == 200


def _binomial_bounds(n: int, p: float, tail: float) -> tuple[int, int]:
    """The smallest [lo, hi] with P(X < lo) + P(X > hi) <= tail for X ~ Binomial(n, p)."""
    pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    lo, below = 0, 0.0
    while below + pmf[lo] <= tail / 2:
        below += pmf[lo]
        lo += 1
    hi, above = n, 0.0
    while above + pmf[hi] <= tail / 2:
        above += pmf[hi]
        hi -= 1
    return lo, hi


def _served(metrics: str, tenant: str, policy: str) -> dict[str, float]:
    """tenant_model_requests_total of `tenant` and `policy`, by model."""
    pattern = re.compile(r"^modelyard:tenant_model_requests_total\{(.*)\} (\S+)$", re.M)
    out = {}
    for labels, value in pattern.findall(metrics):
        found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if found["tenant"] == tenant and found["policy"] == policy:
            out[found["model"]] = float(value)
    return out


def test_routing_on_non_llm_routes(walk: Walk) -> None:
    header = "x-modelyard-route"
    with httpx.Client(base_url=walk.url, headers=walk.auth("ops"), timeout=300) as client:
        routes = [
            client.post("/v1/embeddings", json={"model": "embed", "input": f"text {i}"})
            for i in range(CANARY_REQUESTS)
        ]
        alias = client.post("/predict", json={"model_id": "topic", "input_data": "Goal!"})
        fallback = client.post("/v1/embeddings", json={"model": "embed-safe", "input": "x"})
        again = client.post("/v1/embeddings", json={"model": "embed-safe", "input": "x"})
    beta = httpx.post(
        f"{walk.url}/v1/embeddings",
        json={"model": "tenant-embedder", "input": "x"},
        headers=walk.auth("beta"),
        timeout=300,
    )
    assert all(r.status_code == 200 for r in routes)
    canary = [r for r in routes if r.headers[header] == f"embed->{ONNX_EMBEDDER};canary"]
    stable = [r for r in routes if r.headers[header] == f"embed->{EMBEDDER};direct"]
    assert len(canary) + len(stable) == CANARY_REQUESTS
    assert all(r.json()["model"] == ONNX_EMBEDDER for r in canary)  # the header tells the truth
    lo, hi = _binomial_bounds(CANARY_REQUESTS, CANARY_SHARE, 1e-6)
    assert lo <= len(canary) <= hi, (len(canary), (lo, hi), walk.seed)
    assert alias.headers[header] == f"topic->{ZERO_SHOT};alias", alias.text
    assert alias.json()["predictions"][0][0]["label"] == "sports"
    assert fallback.headers[header] == f"embed-safe->{EMBEDDER};fallback", fallback.text
    assert again.headers[header] == f"embed-safe->{EMBEDDER};fallback"  # primary ranked last
    assert beta.headers[header] == f"tenant-embedder->{ONNX_EMBEDDER};tenant-override"
    metrics = httpx.get(f"{walk.url}/metrics", headers=walk.auth("admin")).text
    assert _served(metrics, "ops", "canary") == {ONNX_EMBEDDER: len(canary)}
    assert _served(metrics, "ops", "direct") == {EMBEDDER: len(stable)}
    assert _served(metrics, "ops", "alias") == {ZERO_SHOT: 1}
    assert _served(metrics, "ops", "fallback") == {EMBEDDER: 2}
    assert _served(metrics, "beta", "tenant-override") == {ONNX_EMBEDDER: 1}


def test_items_per_minute_hold_across_two_servers(walk: Walk) -> None:
    body = {"model": EMBEDDER, "input": ["one", "two", "three", "four"]}  # 4 items of 10/min
    for server in walk.servers:  # both load the model first: no refill while one loads
        warm = httpx.post(
            server.url + "/v1/embeddings", json=body, headers=walk.auth("ops"), timeout=300
        )
        assert warm.status_code == 200, warm.text
    answers = []
    started = time.monotonic()
    for server in (0, 1, 0, 1):
        answers.append(
            httpx.post(
                walk.servers[server].url + "/v1/embeddings",
                json=body,
                headers=walk.auth("bulk"),
                timeout=300,
            )
        )
    elapsed = time.monotonic() - started  # the bucket refills 1 item per 6 s meanwhile
    assert [a.status_code for a in answers] == [200, 200, 429, 429]
    assert [a.headers["x-ratelimit-remaining"] for a in answers[:2]] == ["6", "2"]
    for refused in answers[2:]:
        assert _refused(refused, 429) == "rate_limit_exceeded"
        assert refused.headers["x-ratelimit-limit"] == "10"
        # 2 items missing at 10 per 60 s: 12 s, less what refilled since the bucket was drawn
        assert 12 - elapsed - 1 <= int(refused.headers["retry-after"]) <= 13
        assert int(refused.headers["x-ratelimit-reset"]) >= 40
    usage = httpx.get(f"{walk.url}/admin/usage", headers=walk.auth("admin")).json()
    assert usage["tenants"]["bulk"]["rejections"] == {"ipm": 1}  # this server's own


def test_a_tenant_sees_only_its_models(walk: Walk) -> None:
    mine = httpx.get(f"{walk.url}/models", headers=walk.auth("acme")).json()
    assert set(mine["available_models"]) == {LLM, EMBEDDER, ZERO_SHOT}
    assert LLM in mine["loaded_models"]
    text = json.dumps(mine)
    assert '"pid"' not in text
    assert "budget" not in text
    assert "memory" not in text
    listed = httpx.get(f"{walk.url}/v1/models", headers=walk.auth("acme")).json()["data"]
    assert [m["id"] for m in listed] == [LLM, EMBEDDER, ZERO_SHOT]
    index = httpx.post(f"{walk.url}/v2/repository/index", headers=walk.auth("acme")).json()
    assert {m["name"] for m in index} == {LLM, EMBEDDER, ZERO_SHOT}
    full = httpx.post(f"{walk.url}/v2/repository/index", headers=walk.auth("admin")).json()
    broken = next(m for m in full if m["name"] == "broken-embedder")
    assert broken["state"] == "UNAVAILABLE"
    assert broken["reason"]  # admins see why
    admin = httpx.get(f"{walk.url}/models", headers=walk.auth("admin")).json()
    assert admin["memory"]["budget_bytes"] > 0
    assert httpx.get(f"{walk.url}/metrics", headers=walk.auth("acme")).status_code == 403
    assert httpx.get(f"{walk.url}/metrics").status_code == 401


def test_a_key_listing_an_alias_calls_every_name_of_the_model(walk: Walk) -> None:
    short = {"max_tokens": 2, "temperature": 0}
    chat = [{"role": "user", "content": "Say hi."}]
    calls = [
        ("/v1/chat/completions", {"model": LLM, "messages": chat, **short}),
        ("/v1/completions", {"model": "default-chat", "prompt": "Hello", **short}),
        ("/generate", {"prompts": ["Hello"], **short}),  # the textbook default model
        ("/basic_generate", {"prompt": "Hello", **short}),
    ]
    for path, body in calls:
        response = _post(walk, path, body, "smollm2-only")
        assert response.status_code == 200, (path, response.text)
        assert response.headers["x-modelyard-route"].endswith(f"->{LLM};direct"), path
    _refused(_post(walk, "/v1/embeddings", {"model": EMBEDDER, "input": "x"}, "smollm2-only"), 403)
    listed = httpx.get(f"{walk.url}/v1/models", headers=walk.auth("smollm2-only")).json()["data"]
    assert [m["id"] for m in listed] == [LLM]


def _pin(walk: Walk, key: str, first_token: int) -> httpx.Response:
    tokens = list(range(first_token, first_token + 256))  # 16 blocks of 16 tokens
    return _post(walk, "/v1/prefixes", {"model": "smollm2", "token_ids": tokens}, key)


def test_each_tenant_pins_at_most_its_share(walk: Walk) -> None:
    assert _pin(walk, "pin-a", 1000).status_code == 200
    assert _pin(walk, "pin-b", 2000).status_code == 200  # the other tenant's pins don't count
    refused = _pin(walk, "pin-b", 3000)  # 32 of its 18 blocks
    assert _refused(refused, 507) == "pin_share_exceeded"
    listing = httpx.get(f"{walk.url}/v1/prefixes", headers=walk.auth("pin-b")).json()
    budget = listing["models"][LLM]
    assert budget["tenant_max_pinned_blocks"] == budget["max_pinned_blocks"] * 5 // 100
    assert budget["pinned_blocks"] + 16 <= budget["max_pinned_blocks"]  # the model had room
    assert [p["owner"] for p in listing["data"]] == ["pin-b"]
    narrow = httpx.get(f"{walk.url}/v1/prefixes", headers=walk.auth("embed-only")).json()
    assert narrow["models"] == {}  # not a model it may use


def test_cache_salt_separates_cached_prompts(walk: Walk) -> None:
    first = random.SystemRandom().randrange(5000, 40000)
    prompt = list(range(first, first + 100))  # 6 full blocks the cache can serve

    def cached(salt: str) -> int:
        body = {"model": LLM, "prompt": prompt, "max_tokens": 2, "cache_salt": salt}
        response = _post(walk, "/v1/completions", body, "acme")
        assert response.status_code == 200, response.text
        usage = response.json()["usage"]
        assert (
            usage["prompt_tokens_details"]["cached_tokens"]
            == response.json()["modelyard"]["cached_tokens"]
        )
        return int(usage["prompt_tokens_details"]["cached_tokens"])

    assert cached("tenant-one") == 0
    assert cached("tenant-two") == 0  # the same prompt, another salt: nothing shared
    assert cached("tenant-one") == 96  # the same salt: its 6 blocks
    stream = {
        "model": LLM,
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = _post(walk, "/v1/chat/completions", stream, "acme")
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: {")]
    assert "cached_tokens" in json.loads(events[-1])["usage"]["prompt_tokens_details"]
