"""The shared e2e server fixture (a real `modelyard serve` process, session scoped); the
helpers live in e2e_server.py so test modules can import them by a unique name."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e_server import ServerProcess, start_server, stop_server


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    running = start_server(tmp_path_factory.mktemp("e2e-server"))
    try:
        yield running
    finally:
        stop_server(running)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and "server" in getattr(item, "funcargs", {}):
        running: ServerProcess = item.funcargs["server"]  # type: ignore[attr-defined]
        report.sections.append(("server log (tail)", running.log()[-8000:]))
