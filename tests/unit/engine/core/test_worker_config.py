"""The engine config a catalog entry carries reaches the worker's runner whole: the kernel
switches read by the config layer in the API process are what the runner is built with."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from modelyard.engine.config import EngineConfig
from modelyard.engine.core import worker
from modelyard.manager.catalog import parse_catalog
from modelyard.runner import model_runner
from modelyard.runner.kernel_config import KernelConfig

pytestmark = pytest.mark.unit


class _Built(Exception):
    """Raised by the fake runner once it has seen its arguments."""


def test_the_worker_builds_its_runner_with_the_entrys_kernel_switches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kernels = KernelConfig.from_env(
        {"MODELYARD_ISA": "generic", "MODELYARD_DECODE_LOOP": "0", "MODELYARD_WEIGHTS": "int8"}
    )
    entry = {"id": "m", "kind": "chat", "source": "m.gguf", "options": {"max_loras": 2}}
    (spec,) = parse_catalog([entry])
    assert spec.llm is not None
    config = EngineConfig.from_options(spec.source, spec.options, kernels=kernels)
    sent = pickle.loads(pickle.dumps(config))  # how it crosses to the worker process
    assert sent == config
    seen: dict[str, Any] = {}

    def fake_runner(*args: Any, **kwargs: Any) -> None:
        seen.update(args=args, kwargs=kwargs)
        raise _Built

    monkeypatch.setattr(model_runner, "ModelRunner", fake_runner)
    with pytest.raises(_Built):
        worker._build(sent)
    assert seen["kwargs"]["kernels"] == kernels
    assert seen["kwargs"]["kernels"].isa == "generic"
    assert not seen["kwargs"]["kernels"].decode_loop
    assert seen["args"][3] is not None and seen["args"][3].max_loras == 2  # noqa: PT018


def test_a_catalog_llm_carries_the_config_layers_kernel_switches() -> None:
    (spec,) = parse_catalog([{"id": "m", "kind": "chat", "source": "m.gguf"}])
    assert spec.llm is not None
    assert isinstance(spec.llm.kernels, KernelConfig)
    assert pickle.loads(pickle.dumps(spec)).llm == spec.llm
