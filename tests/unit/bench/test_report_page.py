"""docs/benchmarks.md is generated from benchmarks/results/; the user docs stay short and linked."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
import report_page  # noqa: E402

# [text](target#anchor): a markdown link or image
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s#]*)(?:#([^)\s]*))?\)")


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_committed_page_is_what_the_committed_results_give() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert report_page.render(ROOT / "benchmarks" / "results") == page, (
        "docs/benchmarks.md is stale: run `python benchmarks/report_page.py`"
    )


def test_the_readme_table_is_what_the_committed_results_give() -> None:
    readme = (ROOT / "README.md").read_text()
    table = report_page.headline_table(ROOT / "benchmarks" / "results")
    assert report_page.README_MARK + "\n" + table + "\n\n" in readme
    assert report_page.with_headline_table(readme, table) == readme


def test_the_readme_table_is_replaced_up_to_the_blank_line() -> None:
    readme = f"intro\n\n{report_page.README_MARK}\n| old |\n| old |\n\nafter\n"
    new = report_page.with_headline_table(readme, "| new |")
    assert new == f"intro\n\n{report_page.README_MARK}\n| new |\n\nafter\n"


def test_the_page_and_the_readme_stay_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
    assert len((ROOT / "docs" / "benchmarks.md").read_text().splitlines()) <= 300


def _anchors(doc: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings (fenced code left out)."""
    found, fenced = set(), False
    for line in doc.read_text().splitlines():
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("#"):
            title = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower())
            found.add(title.replace(" ", "-"))
    return found


@pytest.mark.parametrize("doc", _docs(), ids=lambda p: p.name)
def test_every_relative_link_points_at_a_file_and_heading(doc: Path) -> None:
    text = doc.read_text()
    links = LINK.findall(text)
    assert len(links) == text.count("]("), f"{doc.name} has a link split across lines"
    broken = []
    for target, anchor in links:
        if "://" in target:
            continue
        path = doc.parent / target if target else doc
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{target}#{anchor}")
    assert not broken, f"{doc.name} links to missing files or headings: {broken}"


def test_a_host_section_gets_its_verdict_table_and_plot(tmp_path: Path) -> None:
    machine = {"host_kind": "avx2", "cpu_model": "AMD EPYC", "cpu_signature": "25/1/1"}
    machine |= {"cache_size": "512 KB", "time": "2026-12-05T10:00:00+0000"}
    points = {
        "modelyard": {"peak_rss_mb": 1700.0, "points": {"32": {"output_tok_s": 600.0}}},
        "vllm": {"peak_rss_mb": 6600.0, "points": {"32": {"output_tok_s": 100.0}}},
    }
    run = tmp_path / "avx2" / "zen3" / "compare_servers_bfloat16_c32_run1"
    run.mkdir(parents=True)
    summary = {"args": {"dtype": "bfloat16", "weights": ""}, "machine": machine}
    (run / "summary.json").write_text(json.dumps(summary | {"servers": points}))
    page = report_page.render(tmp_path)
    assert "## `avx2`: AMD EPYC Zen 3" in page
    assert (
        "| HTTP c=32 bf16 tok/s, modelyard / vLLM | ≥ 1.3 | 6.00 (6.00-6.00) | 1 of 1 | met |"
        in (page)
    )
    assert "![`avx2`: AMD EPYC Zen 3" in page
    assert report_page.render(tmp_path) == page  # deterministic
    (plot,) = report_page.write_plots(tmp_path, tmp_path / "images")
    assert plot.name == "bench-zen3.png"
    assert plot.stat().st_size > 0
