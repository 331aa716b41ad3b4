"""The image's kernels: built ahead by root, loaded by a non-root user at start, and reported.

- As the Dockerfile does, root builds this CPU's kind into a prebuilt folder
  (`python -m modelyard.runner.kernels --prebuild DIR --kinds KIND`); then an unprivileged user
  (`nobody`, or one made with `useradd`) runs the installed package with
  MODELYARD_PREBUILT_KERNELS=DIR and a kernel build folder it cannot write: the kernels load and
  compute (no build, no lock), and `modelyard serve` reports the kind at `/ready` and in
  `modelyard:kernels_info`.
- Where a container engine answers, the Dockerfile is built and its image run as its own user.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from k8s_render import ROOT

from modelyard.runner.kernel_config import host_kind

pytestmark = pytest.mark.integration

VENV_BIN = Path(sys.executable).parent
KIND = host_kind()
LOAD_AND_RUN = """
import json, torch
from modelyard.engine.config import kernels_from_environment
from modelyard.runner import kernels
x = torch.tensor([[0.0, 3.0, 1.0], [5.0, 2.0, 5.0]])
state = kernels.state(kernels_from_environment())
print(json.dumps({"state": state.kind, "source": state.source,
                  "argmax": kernels.argmax_rows(x).tolist() if kernels.loaded() else None}))
"""


def _unprivileged_user() -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root to run as another, unprivileged user (runuser)")
    if shutil.which("runuser") is None:
        pytest.skip("runuser (util-linux) is not installed")
    for name in ("nobody", "modelyard-test"):
        with_user = [u for u in pwd.getpwall() if u.pw_name == name]
        if with_user:
            return name
    subprocess.run(["useradd", "--no-create-home", "modelyard-test"], check=True)
    return "modelyard-test"


@pytest.fixture(scope="module")
def shared_dir() -> Iterator[Path]:
    """A folder every user can read (pytest's own temp folders are private to their owner)."""
    path = Path(tempfile.mkdtemp(prefix="modelyard-image-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def prebuilt() -> Path:
    """This CPU's kind built ahead by the current (root) user, as the image build does. Kept in
    /var/tmp between runs: a library's name hashes its sources, torch and flags, so one that
    exists is this tree's."""
    from modelyard.runner.kernel_build import prebuilt_name

    folder = Path(f"/var/tmp/modelyard-prebuilt-kernels-{os.getuid()}")
    if not (folder / f"{prebuilt_name(KIND)}.so").is_file():
        command = [sys.executable, "-m", "modelyard.runner.kernels", "--prebuild", str(folder)]
        out = subprocess.run(
            [*command, "--kinds", KIND], capture_output=True, text=True, timeout=1800
        )
        assert out.returncode == 0, out.stderr[-3000:]
    folder.chmod(0o755)
    return folder


def _python_for(user: str, shared_dir: Path) -> Path:
    """The installed environment's interpreter, if `user` may run it; else a venv of a system
    Python of the same version that `user` may run, reading the installed site-packages (a venv
    made from an interpreter inside root's home, as pyenv's, is out of other users' reach)."""
    venv_python = VENV_BIN / "python"
    probe = ["runuser", "-u", user, "--", str(venv_python), "-c", ""]
    if subprocess.run(probe, capture_output=True).returncode == 0:
        return venv_python
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/local/bin:/usr/bin:/bin")
    if system is None:
        pytest.skip(f"{venv_python} is out of {user}'s reach and there is no system {version}")
    bridge = shared_dir / "venv"
    subprocess.run([system, "-m", "venv", "--without-pip", str(bridge)], check=True)
    site_packages = next(VENV_BIN.parent.glob(f"lib/{version}/site-packages"))
    line = f"import site; site.addsitedir({str(site_packages)!r})\n"
    (bridge / "lib" / version / "site-packages" / "installed.pth").write_text(line)
    subprocess.run(["chmod", "-R", "a+rX", str(bridge)], check=True)
    return bridge / "bin" / "python"


def _as_user(user: str, home: Path, python: Path, prebuilt: Path, locked: Path) -> list[str]:
    """runuser with a clean environment: the prebuilt folder, and a build folder it cannot
    write (a build attempt would fail: the kernels must come from the prebuilt folder)."""
    env = {
        "PATH": f"{python.parent}:/usr/bin:/bin",
        "HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "MODELYARD_PREBUILT_KERNELS": str(prebuilt),
        "MODELYARD_KERNEL_DIR": str(locked),
    }
    command = ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items())]
    return [*command, str(python)]


@pytest.fixture
def unprivileged(shared_dir: Path, prebuilt: Path) -> list[str]:
    """The command prefix that runs the installed package's Python as an unprivileged user."""
    user = _unprivileged_user()
    home = shared_dir / f"home-{user}"
    home.mkdir(exist_ok=True)
    shutil.chown(home, user)
    locked = shared_dir / "root-only-build"
    locked.mkdir(mode=0o755, exist_ok=True)
    return _as_user(user, home, _python_for(user, shared_dir), prebuilt, locked)


@pytest.mark.timeout(1800)  # the first test builds the kind (a minute or more)
def test_an_unprivileged_user_loads_and_runs_the_prebuilt_kernels(
    unprivileged: list[str], prebuilt: Path
) -> None:
    out = subprocess.run(
        [*unprivileged, "-c", LOAD_AND_RUN],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"state": KIND, "source": "prebuilt", "argmax": [1, 0]}, out.stderr[-3000:]
    assert [p.name for p in prebuilt.iterdir() if p.suffix != ".so"] == []  # no lock, no build


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(base: str, process: subprocess.Popen[bytes]) -> dict[str, object]:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert process.poll() is None, "modelyard serve exited"
        try:
            body: dict[str, object] = httpx.get(f"{base}/ready", timeout=2).json()
        except httpx.HTTPError:
            body = {}
        if body.get("status") == "ready" and body.get("kernels") is not None:
            return body
        time.sleep(0.5)
    raise AssertionError("modelyard serve did not report its kernels in time")


@pytest.mark.timeout(1800)
def test_serve_as_an_unprivileged_user_reports_the_kind(unprivileged: list[str]) -> None:
    port = _free_port()
    serve = ["-m", "modelyard.cli", "serve", "--port", str(port), "--no-preload"]
    process = subprocess.Popen(
        [*unprivileged, *serve], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        base = f"http://127.0.0.1:{port}"
        body = _wait_ready(base, process)
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
    finally:
        process.terminate()
        _, err = process.communicate(timeout=60)
    assert body["kernels"] == {"kind": KIND, "source": "prebuilt", "error": None}, err[-3000:]
    assert f'modelyard:kernels_info{{kind="{KIND}"}} 1.0' in metrics


def _container_engine() -> str:
    for engine in ("docker", "podman"):
        binary = shutil.which(engine)
        if binary is None:
            continue
        info = subprocess.run([binary, "info"], capture_output=True, text=True, timeout=60)
        if info.returncode == 0:
            return binary
        reason = (info.stderr.strip().splitlines() or ["no answer"])[-1]
        pytest.skip(f"no container engine answers here ({engine} info: {reason})")
    pytest.skip("no container engine (docker or podman) is installed")


@pytest.mark.timeout(7200)
def test_the_image_builds_and_serves_as_its_own_user() -> None:
    engine = _container_engine()
    tag = f"modelyard-test:{os.getpid()}"
    build = [engine, "build", "-f", "deploy/Dockerfile", "-t", tag, "."]
    out = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert out.returncode == 0, out.stderr[-5000:]
    try:
        _check_image(engine, tag)
    finally:
        subprocess.run([engine, "rmi", "-f", tag], capture_output=True, timeout=300)


def _check_image(engine: str, tag: str) -> None:
    run = [engine, "run", "--rm", tag]
    user = subprocess.run([*run, "id", "-u"], capture_output=True, text=True, timeout=300)
    assert user.stdout.strip() == "10001"
    assert subprocess.run([*run, "wget", "--version"], capture_output=True).returncode == 0
    report = subprocess.run(
        [*run, "python", "-m", "modelyard.runner.kernels", "--report"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    state = json.loads(report.stdout.strip().splitlines()[-1])
    assert state == {"kind": KIND, "source": "prebuilt", "error": None}, report.stderr[-3000:]
    port = _free_port()
    serve = ["modelyard", "serve", "--host", "0.0.0.0", "--no-preload", "--allow-insecure"]
    detached = [engine, "run", "-d", "--rm", "-p", f"127.0.0.1:{port}:8000", tag, *serve]
    container = subprocess.run(detached, capture_output=True, text=True, check=True).stdout
    try:
        deadline = time.monotonic() + 300
        body: dict[str, object] = {}
        while time.monotonic() < deadline and body.get("kernels") is None:
            time.sleep(1)
            try:
                body = httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).json()
            except httpx.HTTPError:
                body = {}
        assert body.get("kernels") == {"kind": KIND, "source": "prebuilt", "error": None}
    finally:
        subprocess.run([engine, "rm", "-f", container.strip()], capture_output=True)
