"""Ray-mode configuration: the catalog's `scaling`, the config's `ray:` section, the CLI flags,
the deployment options built from them, and how Ray errors map to the routes' errors."""

from __future__ import annotations

import pytest

from modelyard.config import config_from_mapping
from modelyard.engine.client.protocol import EngineDeadError, EngineOverloadedError
from modelyard.manager.base import ModelUnavailableError
from modelyard.manager.catalog import parse_catalog
from modelyard.scale.config import RayConfig

pytestmark = pytest.mark.unit

ENTRY = {"id": "chat", "kind": "chat", "backend": "llm", "source": "x.gguf"}


def test_scaling_from_the_catalog_entry() -> None:
    (spec,) = parse_catalog([{**ENTRY, "scaling": {"min_replicas": 1, "max_replicas": 4}}])
    assert (spec.scaling.min_replicas, spec.scaling.max_replicas) == (1, 4)
    (plain,) = parse_catalog([ENTRY])
    assert plain.scaling.num_replicas == 1
    assert plain.scaling.max_replicas is None
    with pytest.raises(ValueError, match="replicas"):
        parse_catalog([{**ENTRY, "scaling": {"replicas": 2}}])
    with pytest.raises(ValueError, match="max_replicas"):
        parse_catalog([{**ENTRY, "scaling": {"min_replicas": 3, "max_replicas": 2}}])


def test_ray_section() -> None:
    config = config_from_mapping({"ray": {"router": "pow2", "pool_replicas": 2}})
    assert (config.ray.router, config.ray.pool_replicas) == ("pow2", 2)
    with pytest.raises(ValueError, match="unknown"):
        config_from_mapping({"ray": {"routr": "prefix"}})
    with pytest.raises(ValueError, match="router"):
        config_from_mapping({"ray": {"router": "random"}})
    with pytest.raises(ValueError, match="pool_replicas"):
        config_from_mapping({"ray": {"pool_replicas": 0}})


def test_deployment_options_come_from_the_entry() -> None:
    pytest.importorskip("ray.serve")
    from modelyard.scale.ray_serve import ROUTER_CLASS, llm_deployment

    scaling = {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 2, "num_cpus": 2}
    (spec,) = parse_catalog([{**ENTRY, "scaling": scaling, "options": {"block_size": 32}}])
    deployment = llm_deployment(spec, RayConfig())
    config = deployment._deployment_config
    assert deployment.name == "llm-chat"
    assert config.autoscaling_config.max_replicas == 3
    assert config.autoscaling_config.target_ongoing_requests == 2
    assert deployment.ray_actor_options["num_cpus"] == 2
    router = config.request_router_config
    assert router.request_router_class == ROUTER_CLASS
    assert router.request_router_kwargs["block_size"] == 32
    (fixed,) = parse_catalog([{**ENTRY, "scaling": {"num_replicas": 2}}])
    assert llm_deployment(fixed, RayConfig(router="pow2")).num_replicas == 2


def test_ray_errors_become_the_routes_errors() -> None:
    pytest.importorskip("ray")
    from ray import exceptions as ray_errors
    from ray.serve.exceptions import BackPressureError

    from modelyard.scale.calls import local_error

    died = ray_errors.ActorDiedError()
    assert isinstance(local_error(died, llm=True), EngineDeadError)
    assert isinstance(local_error(died, llm=False), ModelUnavailableError)
    overloaded = local_error(
        BackPressureError(num_queued_requests=9, max_queued_requests=8), llm=True
    )
    assert isinstance(overloaded, EngineOverloadedError)
    cause = EngineOverloadedError("queue full", retry_after_s=3.0)
    wrapped = ray_errors.RayTaskError("generate", "traceback", cause)
    assert local_error(wrapped, llm=True) is cause
    assert local_error(ValueError("bad"), llm=True).args == ("bad",)
