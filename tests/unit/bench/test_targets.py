"""benchmarks/targets.py: which targets a host's result files show met."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit

sys.path.insert(0, str(Path(__file__).parents[3] / "benchmarks"))
import targets  # noqa: E402

ZEN4 = {"host_kind": "avx512-bf16", "cpu_model": "AMD EPYC", "cpu_signature": "25/17/1"}
ZEN4 |= {"cache_size": "1024 KB", "modelyard_env": {}}
HOST = "avx512-bf16: AMD EPYC, 25/17/1, 1024 KB"


def _machine(time: str, commit: str = "abc1234", **extra: Any) -> dict[str, Any]:
    return {**ZEN4, "time": time, "modelyard_commit": commit, **extra}


def _servers(point: str, **by_server: tuple[float, float]) -> dict[str, Any]:
    """by_server: name -> (output tok/s, ITL p50 ms)"""
    return {
        name: {
            "peak_rss_mb": 1000.0 * (i + 1),
            "points": {point: {"output_tok_s": t, "itl_p50_ms": m}},
        }
        for i, (name, (t, m)) in enumerate(by_server.items())
    }


def _write(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))


def _summary(root: Path, name: str, dtype: str, machine: dict[str, Any], servers: Any) -> None:
    args = {"dtype": dtype, "weights": ""}
    _write(root / name / "summary.json", {"args": args, "machine": machine, "servers": servers})


def _share(root: Path, name: str, share: float, machine: dict[str, Any]) -> None:
    bf16 = {"modelyard": {"adjacent_ceiling": {}}, "ratios": {}}
    bf16["ratios"] = {"modelyard_fraction_of_ceiling_c32": share}
    _write(root / name, {"args": {}, "machine": machine, "results": {"bfloat16": bf16}})


@pytest.fixture
def results(tmp_path: Path) -> Path:
    c32 = _servers("32", modelyard=(600.0, 30.0), vllm=(400.0, 60.0))
    _summary(tmp_path, "compare_servers_bfloat16_c32_run1", "bfloat16", _machine("2026-12-01"), c32)
    slow = _servers("32", modelyard=(500.0, 30.0), vllm=(400.0, 60.0))  # 1.25x: misses
    _summary(
        tmp_path, "compare_servers_bfloat16_c32_run2", "bfloat16", _machine("2026-12-02"), slow
    )
    c1 = _servers("1", modelyard=(90.0, 10.0), vllm=(40.0, 25.0), llamacpp=(50.0, 20.0))
    _summary(tmp_path, "compare_servers_bfloat16_c1_run1", "bfloat16", _machine("2026-12-01"), c1)
    for i, share in enumerate([0.42, 0.38, 0.45]):
        _share(tmp_path, f"engine_throughput_run{i}.json", share, _machine(f"2026-12-0{i + 1}"))
    ratios = {"http_over_in_process_c32_median": 0.97}
    serving = {"args": {"dtype": "bfloat16"}, "machine": _machine("2026-12-03"), "ratios": ratios}
    _write(tmp_path / "serving_c32_bfloat16_run1.json", serving)
    # left out: a lower kind played here, a runner switch set, a file of another benchmark
    _share(
        tmp_path,
        "sub/engine_throughput_emulated.json",
        0.1,
        _machine("2026-12-04", emulated={"kind": "avx2"}),
    )
    env = _machine("2026-12-04", modelyard_env={"MODELYARD_KV_TILES": "0"})
    _share(tmp_path, "engine_throughput_switch.json", 0.1, env)
    _write(tmp_path / "kernel_ab_x.json", {"machine": _machine("2026-12-04")})
    _write(tmp_path / "engine_throughput_old.json", {"machine": _machine("2026-12-04")})
    return tmp_path


def _rows(results: Path, since: str = "") -> dict[str, dict[str, Any]]:
    found = targets.read_results([results], since)
    assert list(found) == [HOST]
    return {row["key"]: row for row in targets.verdicts(HOST, found[HOST])}


def test_each_target_gets_latest_median_and_count(results: Path) -> None:
    rows = _rows(results)
    http = rows["http_c32_bfloat16"]
    assert (http["runs"], http["runs_meeting"], http["median"]) == (2, 1, 1.375)
    assert http["latest"]["value"] == 1.25
    assert http["met_by_median"]
    assert rows["rss_bfloat16"]["median"] == 0.5
    assert rows["itl_c1_bfloat16"]["median"] == 0.4
    assert rows["itl_c1_llamacpp"]["median"] == 0.5
    assert rows["server_cost_bfloat16"]["met_by_median"]
    share = rows["share_bfloat16"]  # the avx512-bf16 kind's 40 %; the switched runs left out
    assert (share["threshold"], share["runs"], share["runs_meeting"]) == (0.40, 3, 2)
    assert share["median"] == 0.42
    assert share["latest"]["value"] == 0.45
    assert "http_c32_float32" not in rows  # no float32 runs: no row


def test_a_median_under_the_target_is_not_met(results: Path) -> None:
    for i, share in enumerate([0.30, 0.31]):
        _share(results, f"engine_throughput_late{i}.json", share, _machine("2026-12-05"))
    share = _rows(results)["share_bfloat16"]
    assert share["median"] == 0.38
    assert not share["met_by_median"]
    assert "**not met**" in targets.table(HOST, [share])


def test_since_keeps_the_later_runs(results: Path) -> None:
    rows = _rows(results, since="2026-12-02")
    assert rows["http_c32_bfloat16"]["runs"] == 1
    assert not rows["http_c32_bfloat16"]["met_by_median"]
    assert rows["share_bfloat16"]["runs"] == 2


def test_amx_hosts_need_a_quarter_and_avx2_hosts_no_share() -> None:
    value = targets.Value("share_bfloat16", 0.26, "2026-12-01", "abc", "f")
    (amx,) = targets.verdicts("amx: Xeon, ?, ?", [value])
    assert amx["threshold"] == 0.25
    assert amx["met_by_median"]
    assert targets.verdicts("avx2: EPYC, 25/1/1, 512 KB", [value]) == []
