"""Start a real Triton server from nvidia-pytriton's bundled binary (PEERS.md), with a model
repository holding one python-backend model (`doubler`: OUTPUT0 = 2 * INPUT0, FP32)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import httpx

MODEL_PY = """
import sys
# the stub's isolated interpreter finds the system's stdlib (/usr/lib/python3.11) and other
# site-packages (numpy 2.x); use the stdlib of the Python it links and the venv (PEERS.md)
stdlib = {stdlib!r}
keep = [p for p in sys.path if "site-packages" not in p and not p.startswith("/usr/lib/python")]
sys.path[:] = [{site!r}, stdlib, stdlib + "/lib-dynload", *keep]
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x * 2).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""

CONFIG = """
name: "doubler"
backend: "python"
max_batch_size: 0
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
instance_group [{ kind: KIND_CPU, count: 1 }]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def site_packages() -> Path:
    import pytriton

    return Path(pytriton.__file__).resolve().parent.parent


def write_repository(root: Path) -> Path:
    repo = root / "repo"
    (repo / "doubler" / "1").mkdir(parents=True)
    (repo / "doubler" / "config.pbtxt").write_text(CONFIG)
    stdlib = sysconfig.get_paths()["stdlib"]
    model_py = MODEL_PY.format(site=str(site_packages()), stdlib=stdlib)
    (repo / "doubler" / "1" / "model.py").write_text(textwrap.dedent(model_py))
    return repo


def start_triton(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    """(process, "127.0.0.1:port"); live when returned."""
    site = site_packages()
    server = root / "tritonserver"
    shutil.copytree(site / "pytriton" / "tritonserver", server)
    stub = server / "python_backend_stubs" / "3.11" / "triton_python_backend_stub"
    shutil.copy(stub, server / "backends" / "python" / "triton_python_backend_stub")
    libdir = sysconfig.get_config_var("LIBDIR")
    env = {
        "LD_LIBRARY_PATH": f"{site / 'nvidia_pytriton.libs'}:{libdir}",
        "PATH": "/usr/bin:/bin",
        "PYTHONHOME": sys.base_prefix,  # the stub's stdlib must match the libpython it loads
    }
    http, grpc, metrics = free_port(), free_port(), free_port()
    repo = write_repository(root)
    cmd = [
        str(server / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        "--model-control-mode=explicit",
        f"--backend-directory={server / 'backends'}",
        "--http-address=127.0.0.1",
        f"--http-port={http}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={grpc}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={metrics}",
    ]
    with open(root / "triton.log", "wb") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"127.0.0.1:{http}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://{url}/v2/health/live", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.2)
    process.kill()
    sys.stderr.write((root / "triton.log").read_text(errors="replace"))
    raise RuntimeError("tritonserver did not start")
