"""config_parse: one routine reads every config section, with one error style."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import pytest

from modelyard.config import load_config
from modelyard.config_parse import ConfigError, check_fields, from_mapping, setting
from modelyard.engine.config import EngineConfig, SchedulerConfig

pytestmark = pytest.mark.unit


@dataclass(frozen=True, kw_only=True)
class Limits:
    rpm: int | None = setting(None, ge=1)
    share: float = setting(0.5, ge=0, le=1)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class Member:
    name: str
    mode: Literal["on", "off", "auto"] = "auto"
    limits: Limits = setting(factory=Limits, inline=True)


@dataclass(frozen=True, kw_only=True)
class Root:
    members: Mapping[str, Member] = setting(factory=dict)
    ordered: tuple[Member, ...] = ()
    pairs: tuple[tuple[str, float], ...] = ()
    tags: frozenset[str] = frozenset()
    default: Limits = setting(factory=Limits, key="defaults")


def test_a_tree_is_read_by_the_field_types() -> None:
    root = from_mapping(
        Root,
        {
            "members": {"a": {"rpm": 3, "mode": False}, "b": None},
            "ordered": {"x": {"share": 1}},
            "pairs": {"m": 0.25},
            "tags": "one",
            "defaults": {"rpm": 9},
        },
        "root",
    )
    assert root.members["a"] == Member(name="a", mode="off", limits=Limits(rpm=3))
    assert root.members["b"] == Member(name="b")
    assert root.ordered == (Member(name="x", limits=Limits(share=1.0)),)
    assert root.pairs == (("m", 0.25),)
    assert root.tags == frozenset({"one"})
    assert root.default == Limits(rpm=9)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"bogus": 1}, r"root: unknown key\(s\) \['bogus'\]"),
        ({"members": {"a": {"rpm": 0}}}, r"root.members.a.rpm: must be >= 1, not 0"),
        ({"members": {"a": {"rpm": "ten"}}}, r"root.members.a.rpm: must be an integer"),
        ({"members": {"a": {"mode": "maybe"}}}, r"root.members.a.mode: must be one of"),
        ({"members": ["a"]}, r"root.members: must be a mapping, not list"),
        ({"defaults": {"share": 2}}, r"root.defaults.share: must be <= 1, not 2.0"),
        ({"tags": 3}, r"root.tags: must be a list"),
    ],
)
def test_every_error_names_its_path(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_mapping(Root, data, "root")


def test_objects_built_in_code_meet_the_same_limits() -> None:
    with pytest.raises(ValueError, match=r"max_num_seqs: must be >= 1, not 0"):
        SchedulerConfig(max_num_seqs=0)
    with pytest.raises(ValueError, match=r"mode: must be one of"):
        check_fields(Member(name="x", mode="sideways"))  # type: ignore[arg-type]


def test_engine_options_are_sorted_into_their_sections() -> None:
    config = EngineConfig.from_options(
        "m.gguf",
        {"dtype": "bfloat16", "block_size": 32, "max_num_seqs": 4, "max_waiting_requests": 2},
    )
    assert config.model.model == "m.gguf"
    assert config.model.dtype == "bfloat16"
    assert config.cache.block_size == 32
    assert config.scheduler.max_num_seqs == 4
    assert config.admission.max_waiting_requests == 2
    assert config.cache.kv_cache_bytes == 512 * 1024**2  # the default lives in CacheConfig only
    with pytest.raises(ValueError, match=r"engine options.block_size: must be a power of two"):
        EngineConfig.from_options("m.gguf", {"block_size": 24})


def test_the_server_config_is_one_typed_tree(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "manager: {max_models: 2, worker_preload: [numpy]}\n"
        "gateway: {tenants: {acme: {rpm: 5}}}\n"
        "engine: {dtype: bfloat16}\n"
    )
    config = load_config(path)
    assert config.manager.worker_preload == ("numpy",)
    assert config.gateway.tenants["acme"].quota.rpm == 5
    assert config.engine.dtype == "bfloat16"
    path.write_text("manager: {max_modles: 2}\n")
    with pytest.raises(ValueError, match=r"manager: unknown key\(s\) \['max_modles'\]"):
        load_config(path)
