"""The manifests' Redis keeps API keys and rate limits across a restart, behind its password.

A real redis-server runs with the arguments of deploy/k8s/redis's container (AOF, requirepass
from the rendered Secret; its /data volume is a temp folder); the gateway, configured as the
pods are (config file + MODELYARD_REDIS_URL carrying the Secret's password), creates a key and
spends part of a rate limit; redis-server is stopped as a kubelet stops it (SIGTERM) and started
again on the same folder; the key still authenticates and the spent limit is still spent.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_render import K8S, render, secret_value

from modelyard.config import ModelyardConfig, load_config
from modelyard.gateway.config import Quota
from modelyard.gateway.gateway import Gateway, build_gateway, open_key_store
from modelyard.gateway.keys import new_record
from modelyard.gateway.ratelimit import Charge, Limit, StoreUnavailable
from modelyard.gateway.redis_store import RedisStore, make_client

pytestmark = pytest.mark.integration

QUOTA = Quota(rpm=3)  # a token back every 20 s: a restart takes far less


@dataclass
class ManifestRedis:
    """redis-server as the manifest runs it, restartable on its port and data folder."""

    args: list[str]  # the container's arguments, the Secret and the volume filled in
    password: str  # the Secret's password
    port: int  # loopback port
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (scripts/setup installs it)")
        command = [binary, *self.args, "--port", str(self.port), "--bind", "127.0.0.1"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        """SIGTERM, as a kubelet stops the container: Redis flushes the AOF and exits."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def _manifest_args(data_dir: Path) -> tuple[list[str], str]:
    """The redis container's args with `$(VAR)` from its env (Secret keys read from the render)
    and its volume's mount path replaced by `data_dir`."""
    docs = render("redis")
    container = _container(docs)
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    env = {}
    for item in container.get("env") or []:
        ref = (item.get("valueFrom") or {}).get("secretKeyRef")
        value = secret_value(secrets[ref["name"]], ref["key"]) if ref else item.get("value", "")
        env[item["name"]] = value
    mounts = {m["mountPath"] for m in container.get("volumeMounts") or []}
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]
    args = [str(data_dir) if a in mounts else a for a in args]
    return args, env.get("REDIS_PASSWORD", "")


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[ManifestRedis]:
    args, password = _manifest_args(tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    server = ManifestRedis(args, password, port)
    server.start()
    yield server
    server.stop()


def _pod_config(tmp_path: Path, redis: ManifestRedis) -> ModelyardConfig:
    """The k8s config's gateway section, with the URL the pods put together from the Secret."""
    shipped = yaml.safe_load((K8S / "base" / "config.yaml").read_text())
    gateway = {k: v for k, v in shipped["gateway"].items() if k != "jwt"}  # no JWKS file here
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"gateway": gateway}))
    url = f"redis://:{redis.password}@127.0.0.1:{redis.port}/0"
    return load_config(path, {"MODELYARD_REDIS_URL": url})


async def _spend(gateway: Gateway, tenant: str, times: int) -> list[bool]:
    return [(await gateway.limits.acquire(tenant, QUOTA, Charge())).allowed for _ in range(times)]


async def test_keys_and_limits_survive_a_restart(tmp_path: Path, redis: ManifestRedis) -> None:
    assert redis.password, "the manifest's Redis has no password"
    config = _pod_config(tmp_path, redis)
    key, record = new_record("acme", rpm=QUOTA.rpm)
    open_key_store(config.gateway).add(record)
    gateway = build_gateway(config.gateway)
    try:
        assert await _spend(gateway, "acme", 2) == [True, True]
    finally:
        await gateway.close()

    redis.stop()
    redis.start()

    found = open_key_store(config.gateway).find(key)
    assert found is not None
    assert (found.tenant, found.key_id) == ("acme", record.key_id)
    gateway = build_gateway(config.gateway)
    try:
        last = await gateway.limits.acquire("acme", QUOTA, Charge())
        refused = await gateway.limits.acquire("acme", QUOTA, Charge())
    finally:
        await gateway.close()
    assert last.allowed  # the third of three
    assert (refused.allowed, refused.refused) == (False, Limit.RPM)


async def test_redis_refuses_a_client_without_the_password(redis: ManifestRedis) -> None:
    store = RedisStore(make_client(f"redis://127.0.0.1:{redis.port}/0", 2.0), timeout_s=2.0)
    try:
        with pytest.raises(StoreUnavailable, match=r"(?i)auth"):
            await store.acquire("acme", QUOTA, Charge())
    finally:
        await store.close()
