"""How the API process starts the engine worker: the process entry it names, the environment
the process starts with.

The client (engine/client/core_client.py) hands `worker_main` to transport/spawn.py, which
pickles it by name to a fresh interpreter. Its body runs there only: it imports the worker side
(engine/core/worker.py), which builds the runner. So the API process names the worker's entry
without importing the worker's modules; the wire messages (engine/messages.py) are all the two
sides share.
"""

from __future__ import annotations

import os

from modelyard.build_tools import ninja_dirs
from modelyard.engine.config import EngineConfig
from modelyard.transport.zmq_ipc import IpcAddresses

#: Environment the engine worker process starts with (a value the user set wins); the client
#: passes it to the child only (transport/spawn.py). docs/benchmarks.md has the measurements.
#: - OMP_WAIT_POLICY=PASSIVE: OpenMP threads sleep at barriers instead of spinning; the API
#:   process, the engine and other workers share a few cores, and spinning threads starve them.
#: - GLIBC_TUNABLES (read by glibc before Python starts): freed tensors stay in malloc's heap, so
#:   the next step's same-sized tensors do not page-fault afresh (the worker's RSS stays at its
#:   peak, as with tcmalloc); `hugetlb=1` asks for transparent huge pages on that heap, so decode
#:   attention, which reads the KV cache in blocks scattered over a GiB, misses the TLB less.
WORKER_ENVIRONMENT = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "GLIBC_TUNABLES": (
        "glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=4294967296"
        ":glibc.malloc.trim_threshold=17179869184"
    ),
}


def worker_path() -> list[str]:
    """Folders the engine worker's PATH gets in front: ninja's, where this process does not
    find it, for a runner that builds its kernels on first use (no prebuilt or cached build:
    runner.kernel_build)."""
    return ninja_dirs(os.environ.get("PATH", os.defpath))


def worker_main(config: EngineConfig, addresses: IpcAddresses) -> None:
    """Process entry of the engine worker (runs in the child; never returns: it exits)."""
    from modelyard.engine.core.worker import run_engine_worker

    run_engine_worker(config, addresses)
