"""The fuzzing layer (fuzz.py): schemathesis against the real server's own OpenAPI document,
with the gateway on (as a tenant) and off. No 5xx, statuses and bodies as documented."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fuzz import FuzzReport, Targets, fuzz
from hardening_server import HardeningServer, start, stop

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]  # server start

#: Requests per operation and mode (positive, negative): about 300 in all, ~30 s per mode.
EXAMPLES = 6
TARGETS = Targets(llm="chat", models=("echo-embed", "efficientnet-lite0"))


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HardeningServer]:
    server = start(tmp_path_factory.mktemp("fuzz-open"), gateway=False)
    try:
        yield server
    finally:
        stop(server)


def check(report: FuzzReport) -> None:
    summary = f"{report.requests} requests in {report.seconds:.0f} s, statuses {report.statuses}"
    assert not report.failures, summary + "\n\n" + "\n\n".join(report.failures)
    assert report.statuses.get(200, 0) > 10, summary  # the handlers were reached...
    assert report.statuses.get(400, 0) > 10, summary  # ...and refused what they had to


def test_fuzz_with_the_gateway_on(hardening: HardeningServer) -> None:
    check(fuzz(hardening.url, hardening.headers("alice"), TARGETS, EXAMPLES))


def test_fuzz_with_the_gateway_off(open_server: HardeningServer) -> None:
    check(fuzz(open_server.url, {}, TARGETS, EXAMPLES))
