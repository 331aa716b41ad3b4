"""The build tools that torch's extension builder runs from PATH, for the processes that may
compile the runner's kernels (runner.kernel_build): the kernels command, the engine worker,
the in-process `LLM`.

torch runs `ninja` from PATH; the `ninja` package's copy lives in the venv's bin folder, which
is not on PATH when the venv's python is run directly. The config layer that starts such a
process puts that folder on the PATH it hands over; the runner itself never touches the
environment.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Mapping


def ninja_dirs(path: str) -> list[str]:
    """The folders to put before `path` (a PATH value) so that `ninja` runs: none when it
    already does, or when the `ninja` package is not installed."""
    if shutil.which("ninja", path=path):
        return []
    with contextlib.suppress(ImportError):
        import ninja

        return [str(ninja.BIN_DIR)]
    return []


def path_with_ninja(environ: Mapping[str, str]) -> str:
    """`environ`'s PATH with ninja's folder in front where it needs it."""
    path = environ.get("PATH", os.defpath)
    return os.pathsep.join([*ninja_dirs(path), path])
