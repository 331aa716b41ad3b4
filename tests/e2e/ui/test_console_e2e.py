"""The web console in a real headless chromium against a real `modelyard serve` on the default
catalog: the dashboard shows the loaded models and live metrics that move with traffic, the
memory each model holds and the pinned prefixes; the chat streams tokens into the page, answers
to a JSON schema and shows a forced tool call, an uploaded photo gets its label, the embeddings
matrix matches the API's vectors, and the agent box shows the knowledge agent's answer beside
the chunks it retrieved. Screenshots land in test-artifacts/console/.

One server and one browser for the module; every wait is bounded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import numpy as np
import pytest
import skimage
from console_browser import (
    MODULE_TIMEOUT_S,
    chromium,
    needs_chromium,
    screenshot,
    script_errors,
    start_default_server,
    wait,
)
from e2e_server import ServerProcess, stop_server
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.timeout(MODULE_TIMEOUT_S),
    needs_chromium,
]

CHAT_MODEL = "smollm2-135m-instruct"
IMAGE_MODEL = "efficientnet-lite0"
EMBEDDING_MODEL = "all-minilm-l6-v2"
CHELSEA = Path(skimage.__file__).parent / "data" / "chelsea.png"  # ships in the wheel
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 16}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def agent_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("console-agent") / "index"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, agent_index: Path) -> Iterator[ServerProcess]:
    # short answers keep the agent box quick (its model calls: plan, answer, refine)
    config = f"agent:\n  index: {agent_index}\n  max_tokens: 16\n"
    running = start_default_server(tmp_path_factory.mktemp("console-e2e"), config=config)
    try:
        yield running
    finally:
        stop_server(running)


@pytest.fixture(scope="module")
def browser(server: ServerProcess) -> Iterator[WebDriver]:
    with chromium() as driver:
        driver.get(server.url + "/ui/")
        yield driver
        assert script_errors(driver) == []  # no JavaScript error in the whole session


def _text(driver: WebDriver, selector: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, selector).text)


def _open_panel(driver: WebDriver, panel: str) -> None:
    driver.execute_script("window.scrollTo(0, 0)")  # no subtab under the sticky header
    driver.find_element(By.ID, "tab-playground").click()
    driver.find_element(By.CSS_SELECTOR, f'.subtab[data-panel="{panel}"]').click()
    wait(driver, lambda d: d.find_element(By.ID, f"panel-{panel}").is_displayed(), 5, panel)


def _chat(server: ServerProcess, content: str, max_tokens: int) -> httpx.Response:
    body = {
        "model": CHAT_MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)


def test_dashboard_shows_the_catalog_and_live_metrics(
    server: ServerProcess, browser: WebDriver
) -> None:
    row = f'#models-body tr[data-model="{CHAT_MODEL}"]'
    wait(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, f'{row}[data-status="loaded"]'),
        30,
        "the chat model shown as loaded",
    )
    rows = browser.find_elements(By.CSS_SELECTOR, "#models-body tr")
    catalog = httpx.get(server.url + "/models", timeout=10).json()["models"]
    assert [r.get_attribute("data-model") for r in rows] == [m["id"] for m in catalog]
    assert "loaded" in _text(browser, f"{row} .status-cell")
    assert browser.find_elements(By.CSS_SELECTOR, f'#memory-bar .seg[data-model="{CHAT_MODEL}"]')
    assert browser.find_elements(By.CSS_SELECTOR, f'#kv-list .kv[data-model="{CHAT_MODEL}"]')

    tile = browser.find_element(By.ID, "tile-requests")
    before = int(tile.get_attribute("data-total") or 0)
    for i in range(3):
        assert _chat(server, f"Count to {i + 3}.", 8).status_code == 200
    wait(
        browser,
        lambda d: int(tile.get_attribute("data-total") or 0) >= before + 3,
        20,
        "the request count to move by 3",
    )
    ttft = browser.find_element(By.ID, "tile-ttft")
    wait(
        browser,
        lambda d: "stale" not in str(ttft.get_attribute("class")) and "last 30 s" in ttft.text,
        20,
        "a TTFT p50 over the last 30 s",
    )
    assert _text(browser, "#tile-ttft .tile-value").endswith(("ms", " s"))
    assert _text(browser, "#tile-requests .tile-value") != "0.00"  # a live rate, not just a total
    screenshot(browser, "dashboard")


def test_chat_streams_tokens_into_the_page(server: ServerProcess, browser: WebDriver) -> None:
    _open_panel(browser, "chat")
    Select(browser.find_element(By.ID, "chat-model")).select_by_value(CHAT_MODEL)
    for param, value in (("temperature", "0"), ("max_tokens", "40")):
        field = browser.find_element(By.CSS_SELECTOR, f'#chat-params [data-param="{param}"]')
        field.clear()
        field.send_keys(value)
    prompt = "Write a short poem about the sea."
    browser.find_element(By.ID, "chat-input").send_keys(prompt)
    # Record the assistant's text length at every DOM change, with the time it happened.
    browser.execute_script(
        """
        window.__seen = [];
        new MutationObserver(() => {
          const all = document.querySelectorAll('#chat-log .msg.assistant .content');
          const last = all[all.length - 1];
          if (last) window.__seen.push([performance.now(), last.textContent.length]);
        }).observe(document.querySelector('#chat-log'),
                   {subtree: true, childList: true, characterData: true});
        """
    )
    browser.find_element(By.ID, "chat-send").click()
    done = "#chat-log .msg.assistant[data-done]"
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, done), 120, "the reply to finish")
    message = browser.find_element(By.CSS_SELECTOR, done)
    assert message.get_attribute("data-done") == "true"
    seen: list[list[float]] = browser.execute_script("return window.__seen")
    lengths = [int(n) for _, n in seen]
    growth = [n for i, n in enumerate(lengths) if n > 0 and (i == 0 or n > lengths[i - 1])]
    assert len(growth) >= 5, f"the reply should appear piece by piece, saw {lengths}"
    assert lengths == sorted(lengths)  # only ever appended to
    first_ms = next(t for t, n in seen if n > 0)
    assert seen[-1][0] - first_ms > 50  # spread over time, not one paint
    reply = message.find_element(By.CSS_SELECTOR, ".content").get_attribute("textContent")
    reference = _chat(server, prompt, 40).json()["choices"][0]["message"]["content"]
    assert reply == reference  # greedy: the same tokens as the non-streaming API
    assert int(message.get_attribute("data-chunks") or 0) >= 5
    assert "completion tokens" in _text(browser, "#chat-stats")
    screenshot(browser, "chat")


def _type_into(driver: WebDriver, element_id: str, text: str) -> None:
    field = driver.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(text)


def _send_and_wait(driver: WebDriver) -> WebElement:
    """Click Send; the assistant message once it is done (or failed)."""
    done = "#chat-log .msg.assistant[data-done]"
    before = len(driver.find_elements(By.CSS_SELECTOR, done))
    driver.find_element(By.ID, "chat-send").click()
    wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, done)) > before, 120, "the answer")
    return driver.find_elements(By.CSS_SELECTOR, done)[-1]


def test_chat_answers_to_a_schema_and_shows_a_tool_call(browser: WebDriver) -> None:
    _open_panel(browser, "chat")
    Select(browser.find_element(By.ID, "chat-model")).select_by_value(CHAT_MODEL)
    browser.find_element(By.ID, "chat-clear").click()
    for param, value in (("temperature", "0"), ("max_tokens", "48")):
        field = browser.find_element(By.CSS_SELECTOR, f'#chat-params [data-param="{param}"]')
        field.clear()
        field.send_keys(value)
    schema = browser.find_element(By.ID, "chat-schema")
    wait(browser, lambda d: schema.is_enabled(), 10, "the schema box enabled for the chat model")
    _type_into(browser, "chat-input", "Which city is the Eiffel Tower in?")
    _type_into(browser, "chat-schema", '{"type": "object",')  # not JSON: shown, nothing sent
    browser.find_element(By.ID, "chat-send").click()
    assert "JSON schema: not valid JSON" in _text(browser, "#chat-status")
    assert not browser.find_elements(By.CSS_SELECTOR, "#chat-log .msg")
    _type_into(browser, "chat-schema", '{"type": "nope"}')  # JSON, but the server's 400
    assert _send_and_wait(browser).get_attribute("data-done") == "error"
    assert "response_format" in _text(browser, "#chat-status")
    assert script_errors(browser, allowed=("status of 400",)) == []

    _type_into(browser, "chat-schema", json.dumps(CITY))
    _type_into(browser, "chat-input", "Which city is the Eiffel Tower in?")
    answer = _send_and_wait(browser)
    assert answer.get_attribute("data-done") == "true"
    content = answer.find_element(By.CSS_SELECTOR, ".content").get_attribute("textContent")
    jsonschema.validate(json.loads(content or ""), CITY)

    browser.find_element(By.ID, "chat-clear").click()
    browser.find_element(By.ID, "chat-schema").clear()
    _type_into(browser, "chat-tools", json.dumps([WEATHER_TOOL]))
    Select(browser.find_element(By.ID, "chat-tool-choice")).select_by_value("required")
    _type_into(browser, "chat-input", "What is the weather in Paris?")
    answer = _send_and_wait(browser)
    assert answer.get_attribute("data-done") == "true"
    calls = answer.find_elements(By.CSS_SELECTOR, ".tool-call")
    assert calls  # parallel calls are allowed: each is a get_weather call
    for call in calls:
        badge = call.find_element(By.CSS_SELECTOR, ".badge").get_attribute("textContent")
        assert badge == "tool call"  # shown upper-case by the stylesheet
        assert call.find_element(By.CSS_SELECTOR, ".tool-name").text == "get_weather"
    # the first call is whole (a further one may be cut by max_tokens, as OpenAI cuts it)
    arguments = calls[0].find_element(By.CSS_SELECTOR, ".tool-args").get_attribute("textContent")
    jsonschema.validate(json.loads(arguments or ""), WEATHER_TOOL["function"]["parameters"])
    browser.execute_script("window.scrollTo(0, 0)")  # the transcript, not the side panel
    screenshot(browser, "chat-tool-call")
    browser.find_element(By.ID, "chat-tools").clear()


def test_image_upload_shows_its_label(server: ServerProcess, browser: WebDriver) -> None:
    _open_panel(browser, "image")
    wait(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, f'#img-model option[value="{IMAGE_MODEL}"]'),
        10,
        "the image models in the menu",
    )
    Select(browser.find_element(By.ID, "img-model")).select_by_value(IMAGE_MODEL)
    browser.find_element(By.ID, "img-file").send_keys(str(CHELSEA))
    items = "#img-results li"
    wait(
        browser,
        lambda d: len(d.find_elements(By.CSS_SELECTOR, items)) == 5,
        180,
        "the top 5 labels (the model loads on first use)",
    )
    labels = [e.get_attribute("data-label") for e in browser.find_elements(By.CSS_SELECTOR, items)]
    with CHELSEA.open("rb") as image:
        api = httpx.post(
            server.url + "/predict",
            data={"model_id": IMAGE_MODEL},
            files={"file": ("chelsea.png", image, "image/png")},
            timeout=60,
        ).json()
    assert labels == [p["label"] for p in api["predictions"][0][:5]]
    assert any("cat" in str(label) for label in labels[:3]), labels  # Chelsea is a tabby cat
    assert browser.find_element(By.CSS_SELECTOR, "#img-preview img").get_attribute("naturalWidth")
    screenshot(browser, "image")


def test_embeddings_matrix_matches_the_api(server: ServerProcess, browser: WebDriver) -> None:
    _open_panel(browser, "embeddings")
    wait(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, f'#emb-model option[value="{EMBEDDING_MODEL}"]'),
        10,
        "the embedding models in the menu",
    )
    Select(browser.find_element(By.ID, "emb-model")).select_by_value(EMBEDDING_MODEL)
    sentences = [
        s.strip()
        for s in browser.find_element(By.ID, "emb-input").get_attribute("value").split("\n")
    ]
    browser.find_element(By.ID, "emb-run").click()
    cells = "#emb-matrix td"
    n = len(sentences)
    wait(
        browser,
        lambda d: len(d.find_elements(By.CSS_SELECTOR, cells)) == n * n,
        120,
        "the similarity matrix",
    )
    shown = np.zeros((n, n))
    for cell in browser.find_elements(By.CSS_SELECTOR, cells):
        i, j = int(cell.get_attribute("data-i")), int(cell.get_attribute("data-j"))
        shown[i, j] = float(cell.get_attribute("data-value"))
    body = {"model": EMBEDDING_MODEL, "input": sentences}
    data = httpx.post(server.url + "/v1/embeddings", json=body, timeout=60).json()["data"]
    vectors = np.array([d["embedding"] for d in sorted(data, key=lambda d: d["index"])])
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    np.testing.assert_allclose(shown, unit @ unit.T, atol=1e-5)
    assert shown[0, 1] > shown[0, 4]  # "eating food" is nearer "having a meal" than stocks
    screenshot(browser, "embeddings")


def test_dashboard_shows_who_holds_the_memory(server: ServerProcess, browser: WebDriver) -> None:
    browser.find_element(By.ID, "tab-dashboard").click()
    for model in (CHAT_MODEL, IMAGE_MODEL, EMBEDDING_MODEL):
        wait(
            browser,
            lambda d, m=model: d.find_elements(
                By.CSS_SELECTOR, f'#memory-bar .seg[data-model="{m}"]'
            ),
            10,
            f"{model} in the memory bar",
        )
    legend = _text(browser, "#memory-legend")
    assert IMAGE_MODEL in legend
    assert "free" in legend
    row = browser.find_element(By.CSS_SELECTOR, f'#models-body tr[data-model="{IMAGE_MODEL}"]')
    assert row.get_attribute("data-status") == "loaded"
    assert int(row.find_element(By.CSS_SELECTOR, ".requests").text.replace(",", "")) >= 2
    summary = httpx.get(server.url + "/ui/api/summary", timeout=10).json()
    held = {m["id"]: m.get("memory_bytes", 0) for m in summary["models"]}
    track = browser.find_element(By.ID, "memory-bar").size["width"]
    for model in (CHAT_MODEL, IMAGE_MODEL):
        segment = browser.find_element(By.CSS_SELECTOR, f'#memory-bar .seg[data-model="{model}"]')
        share = held[model] / summary["memory"]["budget_bytes"]
        assert segment.size["width"] / track == pytest.approx(share, abs=0.01)
    for i in range(2):  # live figures for the screenshot
        assert _chat(server, f"Name {i + 2} colours.", 16).status_code == 200
    ttft = browser.find_element(By.ID, "tile-ttft")
    wait(browser, lambda d: "stale" not in str(ttft.get_attribute("class")), 20, "a live TTFT")
    screenshot(browser, "dashboard-loaded")


def test_dashboard_lists_pinned_prefixes(server: ServerProcess, browser: WebDriver) -> None:
    browser.find_element(By.ID, "tab-dashboard").click()
    knowledge = "modelyard keeps models within a memory budget. " * 40  # several KV blocks
    body = {"model": CHAT_MODEL, "text": knowledge, "ttl_s": 600}
    pin = httpx.post(server.url + "/v1/prefixes", json=body, timeout=120).json()
    row = f'#kv-list tr[data-prefix="{pin["id"]}"]'
    cells = wait(
        browser,
        lambda d: [c.text for c in d.find_elements(By.CSS_SELECTOR, f"{row} td")],
        20,
        "the pin in the KV card",
    )
    assert cells[1:3] == [str(pin["num_tokens"]), str(pin["num_blocks"])]
    prompt = {"model": CHAT_MODEL, "prompt": " Summary:", "max_tokens": 4, "prefix_id": pin["id"]}
    assert httpx.post(server.url + "/v1/completions", json=prompt, timeout=120).is_success
    wait(
        browser,
        lambda d: [c.text for c in d.find_elements(By.CSS_SELECTOR, f"{row} td")][3:4] == ["1"],
        20,
        "the pin's hit",
    )
    screenshot(browser, "dashboard-pinned")
    assert httpx.delete(f"{server.url}/v1/prefixes/{pin['id']}", timeout=30).is_success
    wait(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, row), 20, "the pin gone")


KNOWLEDGE = {
    "volcanoes.md": "# Volcanoes\nA volcano erupts when magma rises through the crust. Lava "
    "flows, ash clouds and pyroclastic flows follow an eruption. Mount Etna in Sicily is one "
    "of the most active volcanoes in the world.",
    "baking.md": "# Baking bread\nBread dough is flour, water, salt and yeast. It is kneaded, "
    "left to rise for an hour, shaped and baked in a hot oven until the crust is brown.",
    "chess.md": "# Chess\nChess is played on a board of 64 squares. Each player starts with "
    "sixteen pieces; the game ends when a king is checkmated.",
}


def test_agent_box_shows_the_answer_beside_the_chunks(
    server: ServerProcess, browser: WebDriver, agent_index: Path, tmp_path: Path
) -> None:
    for name, text in KNOWLEDGE.items():
        (tmp_path / name).write_text(text)
    command = [sys.executable, "-m", "modelyard.cli", "agent", "--url", server.url]
    command += ["--index", str(agent_index), "ingest", str(tmp_path)]
    ingest = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert ingest.returncode == 0, ingest.stderr
    indexed = {
        c["chunk_id"]: c for c in json.loads((agent_index / "chunks.json").read_text())["chunks"]
    }
    _open_panel(browser, "agent")
    ask = browser.find_element(By.ID, "agent-ask")
    wait(browser, lambda d: ask.is_enabled(), 10, "the agent box enabled (the server has it)")
    browser.find_element(By.ID, "agent-question").send_keys("What happens when a volcano erupts?")
    ask.click()
    chunks = "#agent-chunks li[data-rank]"
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, chunks), 300, "the agent's answer")
    shown = browser.find_elements(By.CSS_SELECTOR, chunks)
    ids = [c.find_element(By.CSS_SELECTOR, ".chunk-source").text for c in shown]
    texts = [
        c.find_element(By.CSS_SELECTOR, ".chunk-text").get_attribute("textContent") for c in shown
    ]
    assert ids[0].startswith("volcanoes.md")  # retrieval: the document that answers it first
    assert [indexed[i]["text"] for i in ids] == texts  # the index's own chunks, verbatim
    scores = [float(c.find_element(By.CSS_SELECTOR, ".score").text) for c in shown]
    assert scores == sorted(scores, reverse=True)
    assert _text(browser, "#agent-answer")  # the small model's answer, whatever its quality
    status = _text(browser, "#agent-status")
    for step in ("search", "retrieve", "answer", "refine"):  # retrieval through the tool
        assert step in status
    assert "searched: " in status  # the query the model wrote
    screenshot(browser, "agent")
