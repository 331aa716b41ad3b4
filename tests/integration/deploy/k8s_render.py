"""Rendering deploy/k8s overlays with `kubectl kustomize`, and the names a render refers to.

`references(docs)` lists every object another object names: ConfigMaps, Secrets and
PersistentVolumeClaims in pod volumes, `envFrom` and `env.valueFrom` (with the key a
`configMapKeyRef` / `secretKeyRef` reads), ServiceAccounts, Services behind an Ingress or a
StatefulSet, an HPA's target. Pod specs are found wherever they nest (a Deployment's template,
a RayService's head and worker group templates), so a CRD's pods are checked like a
Deployment's.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ["base", "overlays/hpa-cpu", "overlays/hpa-custom-metric", "overlays/ray"]
# Services a controller creates for a custom resource of this kind, from its name
CONTROLLER_SERVICES = {"RayService": ("{name}-serve-svc", "{name}-head-svc")}


def render(path: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (scripts/setup installs it)")
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S / path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@dataclass(frozen=True)
class Reference:
    source: str  # "Kind/name" of the object that names another
    kind: str  # the kind of object named
    name: str  # its name
    key: str | None = None  # the data key read (configMapKeyRef / secretKeyRef)


def references(docs: list[dict[str, Any]]) -> Iterator[Reference]:
    for doc in docs:
        source = f"{doc['kind']}/{doc['metadata']['name']}"
        for pod in _pod_specs(doc):
            yield from _pod_references(source, pod)
        spec = doc.get("spec") or {}
        if doc["kind"] == "Ingress":
            for backend in _ingress_backends(spec):
                yield Reference(source, "Service", backend["service"]["name"])
        if doc["kind"] == "StatefulSet" and spec.get("serviceName"):
            yield Reference(source, "Service", spec["serviceName"])
        if doc["kind"] == "HorizontalPodAutoscaler":
            target = spec["scaleTargetRef"]
            yield Reference(source, target["kind"], target["name"])


def _pod_specs(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            yield node
        for value in node.values():
            yield from _pod_specs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _pod_specs(item)


def _pod_references(source: str, pod: dict[str, Any]) -> Iterator[Reference]:
    if pod.get("serviceAccountName"):
        yield Reference(source, "ServiceAccount", pod["serviceAccountName"])
    for secret in pod.get("imagePullSecrets") or []:
        yield Reference(source, "Secret", secret["name"])
    for volume in pod.get("volumes") or []:
        yield from _volume_references(source, volume)
    for container in [*pod["containers"], *(pod.get("initContainers") or [])]:
        for item in container.get("envFrom") or []:
            if "configMapRef" in item:
                yield Reference(source, "ConfigMap", item["configMapRef"]["name"])
            if "secretRef" in item:
                yield Reference(source, "Secret", item["secretRef"]["name"])
        for env in container.get("env") or []:
            ref = env.get("valueFrom") or {}
            if "configMapKeyRef" in ref:
                key_ref = ref["configMapKeyRef"]
                yield Reference(source, "ConfigMap", key_ref["name"], key_ref["key"])
            if "secretKeyRef" in ref:
                key_ref = ref["secretKeyRef"]
                yield Reference(source, "Secret", key_ref["name"], key_ref["key"])


def _volume_references(source: str, volume: dict[str, Any]) -> Iterator[Reference]:
    if "configMap" in volume:
        yield Reference(source, "ConfigMap", volume["configMap"]["name"])
    if "secret" in volume:
        yield Reference(source, "Secret", volume["secret"]["secretName"])
    if "persistentVolumeClaim" in volume:
        yield Reference(
            source, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]
        )
    for projected in (volume.get("projected") or {}).get("sources") or []:
        if "configMap" in projected:
            yield Reference(source, "ConfigMap", projected["configMap"]["name"])
        if "secret" in projected:
            yield Reference(source, "Secret", projected["secret"]["name"])


def _ingress_backends(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if "defaultBackend" in spec:
        yield spec["defaultBackend"]
    for rule in spec.get("rules") or []:
        for path in (rule.get("http") or {}).get("paths") or []:
            yield path["backend"]


def defined(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> the object, for the render's objects and the Services their
    controllers create (`CONTROLLER_SERVICES`, with no data)."""
    found = {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs}
    for doc in docs:
        for pattern in CONTROLLER_SERVICES.get(doc["kind"], ()):
            name = pattern.format(name=doc["metadata"]["name"])
            found[("Service", name)] = {"kind": "Service", "metadata": {"name": name}}
    return found


def data_keys(doc: dict[str, Any]) -> set[str]:
    return {
        *(doc.get("data") or {}),
        *(doc.get("stringData") or {}),
        *(doc.get("binaryData") or {}),
    }


def secret_value(doc: dict[str, Any], key: str) -> str:
    if key in (doc.get("stringData") or {}):
        return str(doc["stringData"][key])
    return base64.b64decode(doc["data"][key]).decode()
