"""Helpers of the console's browser tests: a real `modelyard serve` on the default catalog, a
headless Debian chromium driven by selenium (chromium-driver), bounded waits and screenshots.

Screenshots go to `test-artifacts/console/` at the repository root (gitignored), or to
`$MODELYARD_TEST_ARTIFACTS/console/`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from e2e_server import ServerProcess, free_port, stop_server
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

REPO = Path(__file__).resolve().parents[3]
READY_TIMEOUT_S = 600.0  # a first start converts the chat model's GGUF file (cached afterwards)
# pytest-timeout's limit for a module whose first test starts the server (setup counts)
MODULE_TIMEOUT_S = int(READY_TIMEOUT_S) + 300
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
# every console module carries it: without the browser they skip (scripts/setup installs it)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="Debian's chromium and chromium-driver are not installed (scripts/setup installs them)",
)
T = TypeVar("T")


def artifacts_dir() -> Path:
    root = os.environ.get("MODELYARD_TEST_ARTIFACTS") or str(REPO / "test-artifacts")
    path = Path(root) / "console"
    path.mkdir(parents=True, exist_ok=True)
    return path


def start_default_server(tmp: Path, *extra: str, config: str | None = None) -> ServerProcess:
    """`modelyard serve` with the embedded default catalog on a free port, once /ready is 200."""
    port = free_port()
    args = [sys.executable, "-m", "modelyard.cli", "serve", "--port", str(port), *extra]
    if config is not None:
        (tmp / "config.yaml").write_text(config)
        args += ["--config", str(tmp / "config.yaml")]
    log_path = tmp / f"server-{port}.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = ServerProcess(f"http://127.0.0.1:{port}", process, log_path)
    try:
        _wait_ready(server)
    except BaseException:  # a failure, or pytest-timeout's interrupt: never leave it running
        stop_server(server)
        raise
    return server


def _wait_ready(server: ServerProcess) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            code = server.process.returncode
            pytest.fail(f"server exited with {code}:\n{server.log()[-6000:]}")
        try:
            if httpx.get(server.url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"server not ready after {READY_TIMEOUT_S} s:\n{server.log()[-6000:]}")


@contextmanager
def chromium() -> Iterator[WebDriver]:
    """A headless chromium with a fresh profile; quit (and the profile removed) on exit."""
    if CHROMIUM is None or CHROMEDRIVER is None:  # the modules skip first (needs_chromium)
        pytest.fail("chromium and chromium-driver are needed (scripts/setup installs them)")
    profile = tempfile.mkdtemp(prefix="modelyard-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait(driver: WebDriver, condition: Callable[[WebDriver], T], timeout: float, what: str) -> T:
    """Poll `condition` until it returns something truthy; fail with `what` after `timeout` s.
    An element the page re-rendered between finding and reading it (the dashboard redraws its
    cards every poll) counts as not yet: the next poll finds the new one."""
    waiter: WebDriverWait[WebDriver] = WebDriverWait(
        driver, timeout, poll_frequency=0.2, ignored_exceptions=[StaleElementReferenceException]
    )
    result: T = waiter.until(condition, message=f"timed out after {timeout} s waiting for {what}")
    return result


def screenshot(driver: WebDriver, name: str) -> Path:
    path = artifacts_dir() / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def script_errors(driver: WebDriver, allowed: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The browser console's SEVERE entries since the last call, minus those matching allowed."""
    entries: list[dict[str, Any]] = driver.get_log("browser")
    return [
        e
        for e in entries
        if e.get("level") == "SEVERE" and not any(a in str(e.get("message")) for a in allowed)
    ]
