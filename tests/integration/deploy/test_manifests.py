"""deploy/: every kustomize overlay renders with `kubectl kustomize` and validates against the
Kubernetes schemas of a pinned version (kubernetes-validate); the RayService's serve config
validates against Ray Serve's own schema and names our app builder; the Dockerfile installs what
scripts/setup installs and runs a command the CLI accepts."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pytest
import yaml
from k8s_render import OVERLAYS, ROOT, render

pytestmark = pytest.mark.integration

KUBERNETES_VERSION = "1.32.0"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates(overlay: str) -> None:
    validate = pytest.importorskip("kubernetes_validate")
    docs = render(overlay)
    kinds = {doc["kind"] for doc in docs}
    for doc in docs:
        if doc["apiVersion"].startswith("ray.io/"):
            continue  # a KubeRay CRD: checked by test_rayservice_runs_our_app_builder
        validate.validate(doc, KUBERNETES_VERSION, strict=True)
    if overlay == "overlays/ray":
        assert {"RayService", "Ingress"} <= kinds
    else:
        assert {"Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget"} <= kinds


def _by_kind(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"]))


def test_single_node_deployment_probes_drain_and_limits() -> None:
    docs = render("overlays/hpa-cpu")
    pod = _by_kind(docs, "Deployment", "modelyard")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    config = yaml.safe_load(_by_kind(docs, "ConfigMap")["data"]["config.yaml"])
    assert pod["terminationGracePeriodSeconds"] > config["server"]["drain_timeout_s"] + 10
    assert config["gateway"]["rate_limit"]["store"] == "redis"
    hpa = _by_kind(docs, "HorizontalPodAutoscaler")["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (3, 15)
    assert hpa["metrics"][0]["resource"]["target"]["averageUtilization"] == 70
    annotations = _by_kind(docs, "Ingress")["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/limit-rps"] == "50"
    assert annotations["nginx.ingress.kubernetes.io/limit-burst-multiplier"] == "5"
    assert annotations["nginx.ingress.kubernetes.io/proxy-body-size"] == "8m"


def test_custom_metric_hpa_matches_the_adapter_rule() -> None:
    docs = render("overlays/hpa-custom-metric")
    metric = _by_kind(docs, "HorizontalPodAutoscaler")["spec"]["metrics"][0]["pods"]["metric"]
    rules = yaml.safe_load(
        _by_kind(docs, "ConfigMap", "modelyard-prometheus-adapter-rules")["data"]["config.yaml"]
    )["rules"]
    assert rules[0]["name"]["as"] == metric["name"]
    assert rules[0]["seriesQuery"].startswith("modelyard:num_requests_waiting")


def test_rayservice_runs_our_app_builder() -> None:
    pytest.importorskip("ray.serve")
    from ray.serve.schema import ServeDeploySchema

    from modelyard.config import config_from_mapping
    from modelyard.manager.catalog import parse_catalog

    docs = render("overlays/ray")
    service = _by_kind(docs, "RayService")
    serve_config = ServeDeploySchema.model_validate(
        yaml.safe_load(service["spec"]["serveConfigV2"])
    )
    app = serve_config.applications[0]
    assert app.import_path == "modelyard.scale.ray_serve:app_builder"
    files = _by_kind(docs, "ConfigMap")["data"]
    mounted = {f"/etc/modelyard/{name}" for name in files}
    assert set(app.args.values()) <= mounted
    config = config_from_mapping(yaml.safe_load(files["config.yaml"]))  # valid for the server
    assert config.ray.router == "prefix"
    catalog = parse_catalog(yaml.safe_load(files["catalog.yaml"]))
    assert any(spec.scaling.max_replicas for spec in catalog)


def _setup_steps(text: str) -> tuple[str, str]:
    torch = re.search(r"install -q (torch==[\w.]+)", text)
    models = re.search(r"--no-deps ((?:[\w-]+==[\w.]+[\s\\]*)+)", text)
    assert torch
    assert models
    return torch.group(1), " ".join(models.group(1).replace("\\", " ").split())


def test_dockerfile_installs_what_setup_installs_and_runs_the_cli() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    setup = (ROOT / "scripts" / "setup").read_text()
    assert _setup_steps(dockerfile) == _setup_steps(setup)
    assert "python -m modelyard.runner.kernels" in dockerfile
    # every kind built ahead, loaded read-only by the non-root user (runner.kernel_build)
    assert "python -m modelyard.runner.kernels --prebuild /opt/modelyard/kernels" in dockerfile
    assert "MODELYARD_PREBUILT_KERNELS=/opt/modelyard/kernels" in dockerfile.rsplit("\nFROM ", 1)[1]
    assert "modelyard.runner.kernels" in setup
    assert re.search(r"^USER 10001$", dockerfile, re.M)  # non-root
    assert dockerfile.count("\nFROM ") + dockerfile.startswith("FROM ") >= 2  # multi-stage
    from modelyard.cli import build_parser

    cmd = yaml.safe_load(re.search(r"^CMD (\[.*\])$", dockerfile, re.M).group(1))  # type: ignore[union-attr]
    assert cmd[0] == "modelyard"
    args = build_parser("serve").parse_args(cmd[1:])
    assert (args.host, args.port, args.catalog) == ("0.0.0.0", 8000, "/etc/modelyard/catalog.yaml")
    deployment = _by_kind(render("base"), "Deployment", "modelyard")
    k8s_cmd = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert k8s_cmd == cmd, shlex.join(k8s_cmd)


@pytest.mark.parametrize(
    "path", ["k8s/base/config.yaml", "k8s/overlays/ray/config.yaml", "compose/config.yaml"]
)
def test_shipped_config_files_load(path: str) -> None:
    from modelyard.config import load_config

    load_config(ROOT / "deploy" / path)  # ValueError on any unknown or bad value


@pytest.mark.parametrize("path", ["k8s/base/catalog.yaml", "k8s/overlays/ray/catalog.yaml"])
def test_shipped_catalogs_load(path: str) -> None:
    from modelyard.manager.catalog import load_catalog

    assert any(spec.kind.is_llm for spec in load_catalog(str(ROOT / "deploy" / path)))
