"""The kernel state the API process reports: `modelyard:kernels_info{kind}` (one series at 1),
an error-level log line when no kernels loaded, and the child-process check's answers."""

from __future__ import annotations

import logging
import sys

import pytest
from obs_helpers import sample

from modelyard.observability.kernels import check_kernels, record_kernels
from modelyard.runner.kernel_config import KernelState

pytestmark = pytest.mark.unit

INFO = "modelyard:kernels_info"


def test_the_gauge_names_the_kind_in_use_and_only_it() -> None:
    record_kernels(KernelState(kind="avx2", source="prebuilt"))
    assert sample(INFO, kind="avx2") == 1
    record_kernels(KernelState(kind="none", source="prebuilt", error="no library"))
    assert sample(INFO, kind="none") == 1
    assert sample(INFO, kind="avx2") == 0  # the old series is gone, not left at 1


def test_no_kernels_is_logged_at_error_level(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="modelyard.observability.kernels"):
        record_kernels(KernelState(kind="avx2", source="built"))
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        record_kernels(KernelState(kind="none", source="prebuilt", error="no library in /x"))
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "no library in /x" in errors[0].getMessage()


def test_switched_off_is_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="modelyard.observability.kernels"):
        record_kernels(KernelState(kind="none", source="off"))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert sample(INFO, kind="none") == 1


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


async def test_the_check_reads_the_childs_last_line() -> None:
    code = 'print("building..."); print(\'{"kind":"amx","source":"prebuilt","error":null}\')'
    assert await check_kernels(_python(code)) == KernelState(kind="amx", source="prebuilt")


async def test_a_failed_check_says_why() -> None:
    code = "import sys; sys.stderr.write('ImportError: no torch'); sys.exit(1)"
    state = await check_kernels(_python(code))
    assert (state.kind, state.source) == ("none", "unknown")
    assert "no torch" in str(state.error)
    missing = await check_kernels(["/nonexistent/python"])
    assert (missing.kind, missing.source) == ("none", "unknown")
    assert "did not start" in str(missing.error)
    slow = await check_kernels(_python("import time; time.sleep(30)"), timeout_s=0.5)
    assert slow.kind == "none"
    assert "0.5 s" in str(slow.error)
