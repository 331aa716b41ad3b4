"""A real local Ray cluster for the e2e tests: a head node and worker nodes, each a separate
`ray start --block` process on 127.0.0.1 with one CPU, every port picked free, its own temp dir.

Stopping a node = SIGKILL of its whole process tree (`ray start`, raylet, agents, workers): the
node leaves the cluster abruptly, as a lost machine would.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from e2e_server import free_port

RAY = str(Path(sys.executable).with_name("ray"))
#: Metrics reach the export port within ~1 s; a node waits longer for its agents on a busy host.
RAY_ENV = {
    "RAY_metrics_report_interval_ms": "1000",
    "RAY_agent_register_timeout_ms": "180000",
    "RAY_raylet_start_wait_time_s": "180",
}


@dataclass
class RayNode:
    """One `ray start --block` process."""

    process: subprocess.Popen[bytes]
    log_path: Path
    metrics_port: int

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tree(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        """SIGKILL the node's whole process tree (raylet, agents, workers): the node is gone."""
        procs = self.tree()
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(procs, timeout=10)
        self.process.wait(10)


@dataclass
class RayCluster:
    """Head + workers; `address` is what `ray start --address` / `ray.init` take."""

    root: Path
    address: str = ""
    nodes: list[RayNode] = field(default_factory=list)

    def _start(self, args: list[str], name: str) -> RayNode:
        metrics_port = free_port()
        # workers' ports below the ephemeral range free_port() draws from: no overlap with them
        worker_low = random.randrange(20_000, 29_800)
        ports = [
            "--node-ip-address=127.0.0.2",
            "--num-cpus=1",
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--metrics-export-port={metrics_port}",
            f"--min-worker-port={worker_low}",
            f"--max-worker-port={worker_low + 100}",
            "--object-store-memory=100000000",
            "--disable-usage-stats",
            "--block",
        ]
        log_path = self.root / f"{name}.log"
        env = {**os.environ, **RAY_ENV}
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [RAY, "start", *args, *ports], stdout=log, stderr=subprocess.STDOUT, env=env
            )
        node = RayNode(process, log_path, metrics_port)
        self.nodes.append(node)
        return node

    def start_head(self) -> RayNode:
        port = free_port()
        # 127.0.0.2 (loopback too): Ray swaps "127.0.0.1" and "localhost" in an address for the
        # host's outward IP, and nothing here may be reached through that
        self.address = f"127.0.0.2:{port}"
        head = self._start(
            [
                "--head",
                f"--port={port}",
                f"--ray-client-server-port={free_port()}",
                "--include-dashboard=false",
                f"--dashboard-port={free_port()}",
                f"--temp-dir={self.root / 'ray'}",
            ],
            "head",
        )
        self.wait_started(head)
        return head

    def add_worker(self) -> RayNode:
        node = self.start_worker()
        self.wait_started(node)
        return node

    def start_worker(self) -> RayNode:
        """Start a worker node without waiting for it (`wait_started` does)."""
        return self._start([f"--address={self.address}"], f"worker{len(self.nodes)}")

    def wait_started(self, node: RayNode, timeout_s: float = 240.0) -> None:
        """Wait until the node's `ray start` says the runtime started."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if node.process.poll() is not None:
                raise RuntimeError(f"ray start exited:\n{node.log()}")
            if "Ray runtime started" in node.log():
                return
            time.sleep(0.5)
        raise RuntimeError(f"Ray node not up after {timeout_s} s:\n{node.log()}")

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()


@dataclass
class RayServe:
    """A `modelyard serve --ray` process and its URL."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_serve(
    cluster: RayCluster, catalog: str, config: str, timeout_s: float = 420.0
) -> RayServe:
    """Write the catalog and config, start `modelyard serve --ray --address`, wait for /ready
    (RuntimeError with the log if it exits or is not ready in time)."""
    stamp = time.monotonic_ns()
    catalog_path = cluster.root / f"catalog-{stamp}.yaml"
    catalog_path.write_text(catalog)
    config_path = cluster.root / f"config-{stamp}.yaml"
    config_path.write_text(config)
    port = free_port()
    args = [sys.executable, "-m", "modelyard.cli", "serve", "--ray", "--address", cluster.address]
    args += ["--port", str(port), "--catalog", str(catalog_path), "--config", str(config_path)]
    log_path = cluster.root / f"serve-{port}.log"
    env = {**os.environ, **RAY_ENV, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    serve = RayServe(f"http://127.0.0.1:{port}", process, log_path)
    try:
        _wait_ready(serve, timeout_s)
    except BaseException:
        serve.stop()
        raise
    return serve


def _wait_ready(serve: RayServe, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if serve.process.poll() is not None:
            raise RuntimeError(f"modelyard serve --ray exited:\n{serve.log()}")
        try:
            if httpx.get(serve.url + "/ready", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"not ready after {timeout_s} s:\n{serve.log()}")


def new_cluster_root() -> Path:
    """A short temp dir (Ray's socket paths must stay under 107 characters)."""
    return Path(tempfile.mkdtemp(prefix="myray-", dir="/tmp"))
