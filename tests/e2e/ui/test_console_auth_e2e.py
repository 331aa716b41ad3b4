"""The console behind the gateway with auth on, in a real headless chromium against a real
`modelyard serve` (default catalog, nothing preloaded): the page loads without a key and asks
for one; a tenant key shows the catalog and only that tenant's usage; an admin key shows every
tenant; a wrong key is refused in the dialog; no view, and no answer of the agent box, shows
a server path. One server and one browser for the module.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from console_browser import (
    MODULE_TIMEOUT_S,
    REPO,
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

from modelyard.gateway.keys import SqliteKeyStore, new_record

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.timeout(MODULE_TIMEOUT_S),
    needs_chromium,
]

TENANT, ADMIN = "acme", "ops"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    store = SqliteKeyStore(tmp_path_factory.mktemp("console-keys") / "keys.db")
    made = {}
    for tenant, admin in ((TENANT, False), (ADMIN, True)):
        key, record = new_record(tenant, admin=admin)
        store.add(record)
        made[tenant] = key
    made["db"] = str(store.path)
    return made


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, keys: dict[str, str]
) -> Iterator[ServerProcess]:
    tmp: Path = tmp_path_factory.mktemp("console-auth-e2e")
    config = f"gateway:\n  auth: on\n  keys: {{sqlite_path: {keys['db']}, cache_ttl_s: 0}}\n"
    config += f"agent:\n  index: {tmp / 'no-index-yet'}\n"  # the agent box's index: none yet
    running = start_default_server(tmp, "--no-preload", config=config)
    try:
        yield running
    finally:
        stop_server(running)


@pytest.fixture(scope="module")
def browser(server: ServerProcess) -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver
        # expected: 401s (the page asks for a key after one) and the agent box's 404 (no index
        # yet); nothing else may fail
        expected = (
            "401 (Unauthorized)",
            "/v1/agent/ask - Failed to load resource: the server responded with a status of 404",
        )
        assert script_errors(driver, allowed=expected) == []


def _server_paths(keys: dict[str, str]) -> list[str]:
    """Folders of this server's machine that no view of the console may show."""
    return [str(REPO), str(Path.home()), sys.prefix, str(Path(keys["db"]).parent)]


def _assert_no_server_paths(
    server: ServerProcess, browser: WebDriver, keys: dict[str, str], key: str
) -> None:
    headers = {"authorization": f"Bearer {key}"}
    summary = httpx.get(server.url + "/ui/api/summary", headers=headers, timeout=10)
    page = str(browser.find_element(By.TAG_NAME, "body").get_attribute("textContent"))
    for path in _server_paths(keys):
        assert path not in summary.text
        assert path not in page


def _use_key(driver: WebDriver, key: str) -> None:
    wait(
        driver,
        lambda d: d.find_element(By.ID, "key-dialog").get_attribute("open") is not None,
        10,
        "the key dialog",
    )
    field = driver.find_element(By.ID, "key-input")
    field.clear()
    field.send_keys(key)
    driver.find_element(By.ID, "key-save").click()


def test_the_page_loads_without_a_key_and_asks_for_one(
    server: ServerProcess, browser: WebDriver
) -> None:
    assert httpx.get(server.url + "/ui/api/summary", timeout=10).status_code == 401
    browser.get(server.url + "/ui/")
    wait(
        browser,
        lambda d: d.find_element(By.ID, "key-dialog").get_attribute("open") is not None,
        15,
        "the key dialog",
    )
    assert "needs an API key" in browser.find_element(By.ID, "key-message").text
    assert browser.find_elements(By.CSS_SELECTOR, "#models-body tr") == []
    screenshot(browser, "auth-key-dialog")


def test_a_wrong_key_is_refused(server: ServerProcess, browser: WebDriver) -> None:
    _use_key(browser, "my-not-a-key")
    wait(
        browser,
        lambda d: "refused" in d.find_element(By.ID, "key-message").text,
        15,
        "the refusal in the dialog",
    )


def test_a_tenant_key_shows_the_catalog_and_its_own_usage(
    server: ServerProcess, browser: WebDriver, keys: dict[str, str]
) -> None:
    admin_headers = {"authorization": f"Bearer {keys[ADMIN]}"}
    assert httpx.get(server.url + "/models", headers=admin_headers, timeout=10).is_success
    _use_key(browser, keys[TENANT])
    wait(browser, lambda d: d.find_element(By.ID, "viewer").text == TENANT, 15, "the tenant")
    catalog = httpx.get(server.url + "/models", headers=admin_headers, timeout=10).json()
    wait(
        browser,
        lambda d: (
            len(d.find_elements(By.CSS_SELECTOR, "#models-body tr")) == len(catalog["models"])
        ),
        15,
        "the catalog",
    )
    wait(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, f'#tenants-body tr[data-tenant="{TENANT}"]'),
        15,
        "the tenant's own usage",
    )
    tenants = browser.find_elements(By.CSS_SELECTOR, "#tenants-body tr[data-tenant]")
    assert [t.get_attribute("data-tenant") for t in tenants] == [TENANT]
    assert not browser.find_element(By.ID, "server-cards").is_displayed()  # admins only
    assert browser.find_element(By.ID, "tenant-note").is_displayed()
    _assert_no_server_paths(server, browser, keys, keys[TENANT])
    screenshot(browser, "auth-tenant")


def test_an_admin_key_shows_every_tenant(
    server: ServerProcess, browser: WebDriver, keys: dict[str, str]
) -> None:
    browser.find_element(By.ID, "key-button").click()
    _use_key(browser, keys[ADMIN])
    wait(
        browser,
        lambda d: d.find_element(By.ID, "viewer").text == f"{ADMIN} · admin",
        15,
        "the admin viewer",
    )
    wait(
        browser,
        lambda d: (
            {
                t.get_attribute("data-tenant")
                for t in d.find_elements(By.CSS_SELECTOR, "#tenants-body tr[data-tenant]")
            }
            >= {TENANT, ADMIN}
        ),
        15,
        "both tenants in the usage table",
    )
    assert browser.find_element(By.ID, "server-cards").is_displayed()
    assert "free" in browser.find_element(By.ID, "memory-legend").text
    _assert_no_server_paths(server, browser, keys, keys[ADMIN])
    screenshot(browser, "auth-admin")


def test_the_agent_box_needs_a_key_and_names_no_server_path(
    server: ServerProcess, browser: WebDriver, keys: dict[str, str]
) -> None:
    body = {"question": "What is modelyard?"}
    url = server.url + "/v1/agent/ask"
    assert httpx.post(url, json=body, timeout=30).status_code == 401
    tenant = {"authorization": f"Bearer {keys[TENANT]}"}
    answer = httpx.post(url, json=body, headers=tenant, timeout=30)
    assert answer.status_code == 404  # no index yet: the message says which command makes one
    message = answer.json()["error"]["message"]
    assert "modelyard agent ingest" in message
    for path in _server_paths(keys):
        assert path not in message
    refused = httpx.post(url, json={**body, "index": "/etc"}, headers=tenant, timeout=30)
    assert refused.status_code == 400  # no request names a server path
    browser.find_element(By.ID, "tab-playground").click()
    browser.find_element(By.CSS_SELECTOR, '.subtab[data-panel="agent"]').click()
    browser.find_element(By.ID, "agent-question").send_keys(body["question"])
    browser.find_element(By.ID, "agent-ask").click()
    status = browser.find_element(By.ID, "agent-status")
    wait(browser, lambda d: "modelyard agent ingest" in status.text, 15, "the server's message")
    assert keys["db"] not in status.text
    browser.find_element(By.ID, "tab-dashboard").click()


def test_windowed_quantiles_follow_prometheus(server: ServerProcess, browser: WebDriver) -> None:
    """stats.js in the page: bucket deltas and linear interpolation inside the bucket, the
    +Inf bucket answered with the last finite bound (histogram_quantile's rules)."""
    result = browser.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        import("/ui/static/js/stats.js").then((s) => {
          const before = {le: [0.1, 0.2, 0.5, "+Inf"], counts: [1, 1, 1, 1], sum: 0.05, count: 1};
          const now = {le: [0.1, 0.2, 0.5, "+Inf"], counts: [3, 7, 11, 11], sum: 2.05, count: 11};
          const delta = s.histDelta(now, before);
          const tail = {le: [0.1, 0.2, 0.5, "+Inf"], counts: [2, 6, 10, 12], sum: 9, count: 12};
          done([delta.counts, delta.count, s.quantile(0.5, delta), s.quantile(0.95, delta),
                s.quantile(0.99, tail), s.mean(delta), s.quantile(0.5, s.histDelta(now, now))]);
        });
        """
    )
    counts, count, p50, p95, p99_tail, mean, empty = result
    assert counts == [2, 6, 10, 10]
    assert count == 10
    assert p50 == pytest.approx(0.1 + 0.1 * (5 - 2) / 4)  # rank 5 in (0.1, 0.2]
    assert p95 == pytest.approx(0.2 + 0.3 * (9.5 - 6) / 4)  # rank 9.5 in (0.2, 0.5]
    assert p99_tail == pytest.approx(0.5)
    assert mean == pytest.approx(0.2)
    assert empty is None
