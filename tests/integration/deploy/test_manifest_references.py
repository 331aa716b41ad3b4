"""Every name a rendered overlay refers to exists in that render (or is made by a controller
that the render asks for: KubeRay's `<RayService>-serve-svc` and `-head-svc`), with the data key
it reads; and what the RayService's pods need besides (the probes KubeRay adds run `wget`)."""

from __future__ import annotations

import re

import pytest
from k8s_render import OVERLAYS, ROOT, data_keys, defined, references, render

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_reference_resolves(overlay: str) -> None:
    docs = render(overlay)
    objects = defined(docs)
    missing = []
    for ref in references(docs):
        target = objects.get((ref.kind, ref.name))
        if target is None:
            missing.append(f"{ref.source} -> {ref.kind}/{ref.name}")
        elif ref.key is not None and ref.key not in data_keys(target):
            missing.append(f"{ref.source} -> {ref.kind}/{ref.name} key {ref.key!r}")
    assert not missing, "\n".join(missing)


def test_references_are_found_inside_a_rayservice() -> None:
    """The walk reaches the head's and every worker group's pod template (a check of the
    check: an empty list would make the test above pass on anything)."""
    refs = [r for r in references(render("overlays/ray")) if r.source.startswith("RayService/")]
    kinds = {r.kind for r in refs}
    assert {"ConfigMap", "Secret"} <= kinds
    assert len([r for r in refs if r.kind == "ConfigMap"]) == 2  # head + the worker group


def test_rayservice_pods_can_run_kuberays_probes() -> None:
    """KubeRay gives Ray containers without their own probes readiness / liveness probes that
    run `wget`: the image installs it, or every Ray container sets both probes itself."""
    runtime_stage = (ROOT / "deploy" / "Dockerfile").read_text().rsplit("\nFROM ", 1)[1]
    if re.search(r"apt-get install[^\n]*\bwget\b", runtime_stage):
        return
    docs = render("overlays/ray")
    service = next(d for d in docs if d["kind"] == "RayService")
    config = service["spec"]["rayClusterConfig"]
    groups = [config["headGroupSpec"], *config["workerGroupSpecs"]]
    for group in groups:
        for container in group["template"]["spec"]["containers"]:
            assert {"readinessProbe", "livenessProbe"} <= set(container), container["name"]
