"""A real `modelyard serve` process (the server developer's entry point) on a catalog of tiny
models built here (ONNX graphs and the echo backend): no weights, fast loads."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

MB = 1024 * 1024


def tiny_affine(path: Path, scale: float) -> Path:
    """ONNX: y = scale * x + 1 over FP32 [n]."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["t"]), helper.make_node("Add", ["t", "one"], ["y"])],
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
        initializer=[
            helper.make_tensor("k", TensorProto.FLOAT, [1], [scale]),
            helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def tiny_image_classifier(path: Path) -> Path:
    """ONNX: (B, 3, 224, 224) -> mean per channel -> (B, 1000) logits (a fixed random map)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(0).normal(size=(3, 1000)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["image"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"]),
            helper.make_node("MatMul", ["flat", "w"], ["logits"]),
        ],
        "tiny-image",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["b", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", 1000])],
        initializer=[numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


SCALES = {"a": 2.0, "b": 3.0, "c": 4.0, "d": 5.0}


def catalog(root: Path) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for name, scale in SCALES.items():
        entries.append(
            {
                "id": name,
                "kind": "tensor",
                "backend": "onnx",
                "source": str(tiny_affine(root / f"{name}.onnx", scale)),
                "memory_estimate_bytes": 100 * MB,
            }
        )
    entries += [
        {
            "id": "emb",
            "aliases": ["echo-embedding"],
            "kind": "embedding",
            "backend": "echo",
            "memory_estimate_bytes": 100 * MB,
            "batching": {"max_batch_size": 16, "max_queue_delay_ms": 2},
        },
        {
            "id": "clf",
            "kind": "zero-shot-classification",
            "backend": "echo",
            "memory_estimate_bytes": 100 * MB,
            "options": {"labels": ["apple", "banana"]},
        },
        {
            "id": "img",
            "kind": "image-classification",
            "backend": "onnx",
            "source": str(tiny_image_classifier(root / "img.onnx")),
            "memory_estimate_bytes": 100 * MB,
            "options": {"preset": "image-classification"},
        },
        {
            "id": "ka",
            "kind": "embedding",
            "backend": "echo",
            "keep_alive_s": 0.5,
            "memory_estimate_bytes": 100 * MB,
        },
        {
            "id": "pinned",
            "kind": "embedding",
            "backend": "echo",
            "pin": True,
            "memory_estimate_bytes": 10 * MB,
        },
    ]
    return entries


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SERVE = (
    "import sys\n"
    f"sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
    "from fakes.echo import register_echo\n"
    "register_echo()\n"
    "from modelyard.api.cli import serve\n"
    "from modelyard.config import load_config\n"
    "sys.exit(serve(load_config(sys.argv[1]), log_level='warning'))\n"
)


def start_server(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    """(process, base URL); ready (preloads done) when returned."""
    port = free_port()
    (root / "catalog.yaml").write_text(yaml.safe_dump({"models": catalog(root)}))
    config = {
        "server": {"host": "127.0.0.1", "port": port},
        "catalog": str(root / "catalog.yaml"),
        "manager": {
            "memory_budget_bytes": 260 * MB,  # the pinned model + two others
            "measure_memory": False,  # tiny workers: keep the textbook arithmetic exact
            "sweep_interval_s": 0.1,
            "wait_timeout_s": 60,
            "worker_preload": ["onnxruntime", "numpy"],
        },
    }
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    with open(root / "server.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", SERVE, str(root / "config.yaml")],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError((root / "server.log").read_text(errors="replace")[-3000:])
