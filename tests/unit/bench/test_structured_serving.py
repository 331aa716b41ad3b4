"""benchmarks/structured_serving.py's pure parts: reading `vllm bench serve` results and the
server's metrics, the ratios, and their verdicts and section on the benchmarks page."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.unit

sys.path.insert(0, str(Path(__file__).parents[3] / "benchmarks"))
import report_structured  # noqa: E402
import structured_serving as bench  # noqa: E402
import targets  # noqa: E402
import vllm_client  # noqa: E402

MACHINE = {"host_kind": "avx2", "cpu_model": "AMD EPYC", "cpu_signature": "25/1/1"}
MACHINE |= {"cache_size": "512 KB", "modelyard_env": {}, "time": "2026-12-07T20:00:00"}


def _vllm_result(tok_s: float, itl_ms: float, tokens: int, completed: int = 4) -> dict[str, Any]:
    """The fields of a `vllm bench serve` result file the benchmark reads."""
    return {
        "completed": completed,
        "failed": 0,
        "total_output_tokens": tokens,
        "output_throughput": tok_s,
        "median_itl_ms": itl_ms,
        "p99_itl_ms": itl_ms * 3,
        "median_ttft_ms": 500.0,
        "median_tpot_ms": itl_ms,
        "duration": 2.0,
        "generated_texts": ['{"title":"a', " {", "plain"],
    }


def test_a_client_result_gives_the_per_run_figures() -> None:
    metrics = vllm_client.run_metrics(_vllm_result(400.0, 50.0, tokens=510))
    assert metrics["output_tok_s"] == 400.0
    assert (metrics["itl_p50_ms"], metrics["itl_p99_ms"]) == (50.0, 150.0)
    assert metrics["mean_output_tokens"] == 127.5
    assert metrics["outputs_opening_an_object"] == 2


def _round(con_tok_s: float, con_itl: float) -> dict[str, Any]:
    runs = {
        "unconstrained": vllm_client.run_metrics(_vllm_result(400.0, 50.0, 512)),
        "constrained": vllm_client.run_metrics(_vllm_result(con_tok_s, con_itl, 512)),
    }
    return {"runs": runs, "ratios": bench.round_ratios(runs)}


def test_ratios_are_per_round_then_their_median() -> None:
    rounds = [_round(380.0, 52.0), _round(300.0, 70.0), _round(390.0, 51.0)]
    assert rounds[0]["ratios"]["output_tok_s"] == 0.95
    assert rounds[0]["ratios"]["itl_p50"] == 1.04
    median = bench.median_ratios(rounds)
    assert (median["output_tok_s"], median["itl_p50"]) == (0.95, 1.04)


def test_rounds_alternate_their_order() -> None:
    forward, backward = ("unconstrained", "constrained"), ("constrained", "unconstrained")
    assert [bench.round_order(i) for i in range(3)] == [forward, backward, forward]


def test_the_compile_counter_is_summed_over_its_labels() -> None:
    text = (
        "# TYPE modelyard:structured_compile_seconds_total counter\n"
        'modelyard:structured_compile_seconds_total{model="a"} 0.25\n'
        'modelyard:structured_compile_seconds_total{model="b"} 0.5\n'
        'modelyard:structured_compile_seconds_created{model="a"} 1.7e9\n'
    )
    assert bench.counter_value(text, bench.COMPILE_COUNTER) == 0.75
    assert bench.counter_value("", bench.COMPILE_COUNTER) == 0.0


def _result_file(path: Path, concurrency: int, rounds: list[dict[str, Any]]) -> None:
    setup = {"ttft_ms": 900.0, "compile_ms": 0.0}
    compiled = {"first": {"compile_ms": 12.5, "ttft_ms": 80.0}}
    compiled["cached"] = {"compile_ms": 0.0, "ttft_ms": 40.0}
    payload = {
        "machine": MACHINE,
        "args": {"concurrency": concurrency, "dtype": "bfloat16"},
        "rounds": rounds,
        "ratios_median": bench.median_ratios(rounds),
        "compile": {"grammar_setup_request": setup, "schemas": {"person": compiled}},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))


def test_c32_runs_give_verdicts_and_the_section(tmp_path: Path) -> None:
    _result_file(tmp_path / "avx2" / "structured_serving.json", 32, [_round(300.0, 70.0)])
    _result_file(tmp_path / "avx2" / "structured_serving_c8.json", 8, [_round(400.0, 50.0)])
    values = next(iter(targets.read_results([tmp_path]).values()))
    assert {(v.key, v.value) for v in values} == {
        ("structured_tok_s", 0.75),
        ("structured_itl_p50", 1.4),
    }
    section = report_structured.section(tmp_path, link_prefix="../r/")
    assert section is not None
    assert "0.75 (0.75-0.75), **not met**" in section
    assert "1.40 (1.40-1.40), **not met**" in section
    assert "| person | 12.5 ms | 80 ms | 40 ms |" in section
    assert "| bfloat16 | 1 |" in section
    assert "[avx2/structured_serving.json](../r/avx2/structured_serving.json)" in section
    assert report_structured.section(tmp_path / "none", link_prefix="") is None


def test_the_first_text_of_a_completions_stream_is_found() -> None:
    assert bench.first_text('data: {"choices": [{"index": 0, "text": "{\\""}]}')
    assert not bench.first_text('data: {"choices": [{"index": 0, "text": ""}]}')
    assert not bench.first_text('data: {"choices": [], "usage": {"completion_tokens": 8}}')
    assert not bench.first_text("data: [DONE]")
