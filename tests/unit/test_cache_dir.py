"""`MODELYARD_CACHE_DIR` is read by the config layer when a model's config is built and handed
down with it: the engine's `ModelConfig.cache_dir` (GGUF conversions, in the engine worker) and
the ONNX backend's `OnnxOptions.cache_dir` (exports, in its worker); `sources.cache_dir` only
makes the folder a config names."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from modelyard import sources
from modelyard.backends.options import OnnxOptions
from modelyard.cache_dir import DEFAULT_CACHE_DIR
from modelyard.engine.config import EngineConfig, ModelConfig

pytestmark = pytest.mark.unit


def test_the_configs_take_the_environment_when_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELYARD_CACHE_DIR", str(tmp_path))
    config = EngineConfig.from_options("model.gguf", {})
    assert config.model.cache_dir == str(tmp_path)
    assert OnnxOptions().cache_dir == str(tmp_path)
    monkeypatch.delenv("MODELYARD_CACHE_DIR")
    # what the worker is handed: the value read when the config was built
    assert pickle.loads(pickle.dumps(config)).model.cache_dir == str(tmp_path)
    assert ModelConfig(model="m").cache_dir == DEFAULT_CACHE_DIR
    assert OnnxOptions().cache_dir == DEFAULT_CACHE_DIR


def test_a_catalog_entry_or_caller_may_name_its_own(tmp_path: Path) -> None:
    config = EngineConfig.from_options("model.gguf", {"cache_dir": str(tmp_path)})
    assert config.model.cache_dir == str(tmp_path)


def test_sources_makes_the_folder_a_config_names(tmp_path: Path) -> None:
    folder = sources.cache_dir(str(tmp_path / "derived"))
    assert folder == tmp_path / "derived"
    assert folder.is_dir()
