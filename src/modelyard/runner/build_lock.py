"""One builder at a time per kernel build folder, and no wait on a builder that died.

torch's extension builder guards a build folder with a `lock` file that it creates and deletes
itself; a builder killed mid-build leaves that file behind, and every later build of the same
sources waits for it forever (silently). Every modelyard build first takes an `flock` on a
file beside the folder: the kernel releases it when its holder dies, so whoever holds it knows
that no live modelyard builder owns torch's `lock` file, and removes one left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


@contextlib.contextmanager
def exclusive_build(build_dir: Path) -> Iterator[None]:
    """Hold the build folder's flock; clear a `lock` file that a killed builder left."""
    with open(build_dir.with_name(build_dir.name + ".flock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            stale = build_dir / "lock"
            if stale.exists():
                log.warning("removing %s, left by a kernel build that did not finish", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
