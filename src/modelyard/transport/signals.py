"""Signal policy of worker processes.

Workers are stopped by their parent (a Shutdown message, then kill as a last resort), never by a
signal aimed at the whole process group: Ctrl-C in a terminal, or SIGTERM from a supervisor or
`timeout`, reach every process of the group, and a worker that died first would fail the
requests the API process is still draining. A worker whose parent died exits on its own (each
worker loop watches its parent's pid).
"""

from __future__ import annotations

import signal


def ignore_group_signals() -> None:
    """Call first thing in a worker process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
