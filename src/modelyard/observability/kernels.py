"""The runner's native kernels as the API process reports them.

The API process runs no model and imports no torch, so at start `check_kernels` asks a child
process (`python -m modelyard.runner.kernels --report`, same environment and CPU as the workers)
to load the kernels as a worker will, and returns its `KernelState`. `record_kernels` puts it in
the gauge `modelyard:kernels_info{kind}` (1 on one series) and logs at error level when none
loaded (kind "none" with an error): the models then run on the pure-torch path, slower. `/ready`
shows the same state under `kernels` (api/routes/health.py).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

import msgspec

from modelyard.observability.metrics import KERNELS_INFO
from modelyard.runner.kernel_config import KernelState

log = logging.getLogger(__name__)

REPORT_COMMAND = (sys.executable, "-m", "modelyard.runner.kernels", "--report")


async def check_kernels(
    command: Sequence[str] = REPORT_COMMAND, *, timeout_s: float = 1800.0
) -> KernelState:
    """Load the kernels in a child process (a first build here may take minutes) and return
    what it loaded; a child that fails or answers nonsense gives kind "none" with its error."""
    try:
        child = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except OSError as exc:
        return _failed(f"kernel check did not start: {exc}")
    try:
        out, err = await asyncio.wait_for(child.communicate(), timeout_s)
    except TimeoutError:
        child.kill()
        await child.wait()
        return _failed(f"kernel check still running after {timeout_s:g} s")
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        return msgspec.json.decode(lines[-1] if lines else "", type=KernelState)
    except msgspec.DecodeError:
        detail = err.decode(errors="replace").strip()[-500:] or f"exit status {child.returncode}"
        return _failed(f"kernel check failed: {detail}")


def _failed(error: str) -> KernelState:
    return KernelState(kind="none", source="unknown", error=error)


def record_kernels(state: KernelState) -> None:
    """Set `modelyard:kernels_info` to `state.kind`; log an error when none loaded."""
    KERNELS_INFO.clear()
    KERNELS_INFO.labels(kind=state.kind).set(1)
    if state.kind == "none" and state.error is not None:
        log.error("no native kernels: models run on the slower torch path: %s", state.error)
