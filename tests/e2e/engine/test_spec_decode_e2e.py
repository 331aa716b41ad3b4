"""Speculative decoding through a real `modelyard serve` (OpenAI API, real handlers): the
catalog turns prompt lookup on for the default model; greedy answers with and without
speculation are identical (streamed or not), and /metrics counts the drafts."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from e2e_server import CATALOG, E2E_MODEL, ServerProcess, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SPEC_CATALOG = (
    CATALOG
    + """      draft: ngram
      num_speculative_tokens: 5
"""
)
TEXT = (
    "Copy this sentence exactly: The museum sells postcards, maps of the coastal path and "
    "small books about the history of navigation, from the first stone towers lit by fires."
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    running = start_server(tmp_path_factory.mktemp("spec-e2e"), catalog_yaml=SPEC_CATALOG)
    try:
        yield running
    finally:
        stop_server(running)


def chat(server: ServerProcess, speculate: bool, stream: bool = False) -> str:
    body = {
        "model": E2E_MODEL,
        "messages": [{"role": "user", "content": TEXT}],
        "temperature": 0,
        "max_tokens": 48,
        "speculate": speculate,
        "stream": stream,
    }
    if not stream:
        response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        return str(response.json()["choices"][0]["message"]["content"])
    text = ""
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=body, timeout=120
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = httpx.Response(200, content=line[6:]).json()
                text += (
                    chunk["choices"][0]["delta"].get("content") or "" if chunk["choices"] else ""
                )
    return text


def counter(server: ServerProcess, name: str) -> float:
    body = httpx.get(f"{server.url}/metrics", timeout=30).text
    pattern = rf'^modelyard:{name}_total{{[^}}]*method="ngram"[^}}]*}} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, body, flags=re.MULTILINE))


def test_speculative_answers_equal_plain_ones_and_metrics_count_drafts(
    server: ServerProcess,
) -> None:
    drafts_before = counter(server, "spec_decode_num_draft_tokens")
    plain = chat(server, speculate=False)
    assert counter(server, "spec_decode_num_draft_tokens") == drafts_before
    assert chat(server, speculate=True) == plain
    assert chat(server, speculate=True, stream=True) == plain
    assert counter(server, "spec_decode_num_draft_tokens") > drafts_before
    assert counter(server, "spec_decode_num_accepted_tokens") > 0
    assert counter(server, "spec_decode_num_drafts") > 0
