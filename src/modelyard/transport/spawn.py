"""Start a worker in a fresh interpreter with an environment of its own.

`multiprocessing`'s spawn start method gives a child the parent's `os.environ` as it is; a worker
that needs other variables at exec time (the engine worker's `GLIBC_TUNABLES`, which glibc reads
before Python starts) would have to set them in the API process, where they leak into every
process started later. `start_process(target, args, env=...)` instead runs
`python -m modelyard.transport.child` with `os.environ` plus `env` (a value the user set wins),
the folders of `path` put in front of its PATH (tools the child runs: ninja for a kernel build,
modelyard.build_tools), and pickles `sys.path`, then `(target, args)`, to the child's stdin; the
child calls `target(*args)` and exits with its status. The returned `PopenProcess` is a
`ProcessHandle` for the supervisor. Children still running when the API process exits are
killed (as multiprocessing does for daemon processes).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import pickle
import subprocess
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_running: weakref.WeakSet[PopenProcess] = weakref.WeakSet()


class PopenProcess:
    """A child started by `start_process`, with multiprocessing.Process's method names."""

    def __init__(self, popen: subprocess.Popen[bytes], name: str) -> None:
        self._popen = popen
        self.name = name

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def exitcode(self) -> int | None:
        """None while running; the exit status, or -N when killed by signal N."""
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout)

    def terminate(self) -> None:
        if self.is_alive():
            self._popen.terminate()

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()


def child_environment(env: Mapping[str, str], path: Sequence[str]) -> dict[str, str]:
    """`os.environ` over `env`, with `path`'s folders in front of PATH."""
    child = {**env, **os.environ}
    if path:
        child["PATH"] = os.pathsep.join([*path, child.get("PATH", os.defpath)])
    return child


def _launch(
    target: Callable[..., object],
    args: tuple[Any, ...],
    env: Mapping[str, str],
    path: Sequence[str],
    name: str,
) -> PopenProcess:
    payload = pickle.dumps(list(sys.path)) + pickle.dumps((target, args))
    popen = subprocess.Popen(
        [sys.executable, "-m", "modelyard.transport.child", name],
        stdin=subprocess.PIPE,
        env=child_environment(env, path),
    )
    stdin = popen.stdin
    if stdin is None:  # pragma: no cover - stdin=PIPE always gives one
        raise RuntimeError("no pipe to the child")
    try:
        stdin.write(payload)
        stdin.close()
    except BrokenPipeError:  # the child died at once: its exit code tells the supervisor
        pass
    process = PopenProcess(popen, name)
    _running.add(process)
    return process


async def start_process(
    target: Callable[..., object],
    args: tuple[Any, ...],
    *,
    env: Mapping[str, str] | None = None,
    path: Sequence[str] = (),
    name: str = "modelyard-worker",
) -> PopenProcess:
    """Start `target(*args)` in a new interpreter (in a thread: never blocks the loop)."""
    return await asyncio.to_thread(_launch, target, args, env or {}, path, name)


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_running):
        process.kill()
