"""Writes docs/benchmarks.md and its plots from the result JSON under benchmarks/results/.

`python benchmarks/report_page.py` rewrites the page and one PNG per host under docs/images/;
`--check` only says whether the committed page is what the results give (exit 1 if not);
`--no-plots` leaves the PNGs alone. It also rewrites README.md's headline table (the lines after
`README_MARK`) from the same verdicts. The page is a pure function of the result files: the same
files give the same bytes (tests/unit/bench/test_report_page.py holds the page to that).

Pipeline: `targets.read_results` gives each host's verdict per target; the compare_servers
summaries of the same default runs give the absolute figures behind the plots; runs that played
a lower kind (`--emulate`) or served the GGUF blocks (`--weights gguf`) get one table of their
own; `structured_serving.py`'s runs give the "Structured output" section
(`report_structured.py`); the other benchmarks' JSON give one line each (`report_other.py`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import report_other
import report_structured
import targets

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
IMAGES = ROOT / "docs" / "images"
SERVERS = ("modelyard", "vllm", "llamacpp")
SERVER_NAMES = {"modelyard": "modelyard", "vllm": "vLLM", "llamacpp": "llama.cpp"}
DTYPES = ("bfloat16", "float32")


@dataclass(frozen=True)
class Host:
    label: str  # targets.host_of(machine): kind, CPU model, signature, cache
    slug: str  # the plot's file name: docs/images/bench-<slug>.png
    title: str  # the section heading
    notes: str = ""  # what a reader needs to read the misses (markdown, may be empty)


HOSTS = [
    Host(
        "avx512-bf16: AMD EPYC, 25/17/1, 1024 KB",
        "zen4",
        "`avx512-bf16`: AMD EPYC Zen 4",
        "A decode step here is bound by its GEMMs' arithmetic; single runs of the HTTP cost dip "
        "under 0.95× when the load client and the API process take CPU from the engine's two "
        "cores.",
    ),
    Host(
        "avx512-bf16: AMD EPYC, 26/2/1, 1024 KB",
        "zen5",
        "`avx512-bf16`: AMD EPYC Zen 5",
        "Zen 5 runs bf16 dot products on full 512-bit datapaths, so its bf16 matmul ceiling is "
        "about 4.4× float32's while memory reads ~40 GB/s: even with every GEMM at the ceiling's "
        "rate, the weights and K/V a c=32 step must read keep the share under ~47 %, and 40 % "
        "needs a ~16 ms step where the engine's takes 18-20 ms. Float32 sits at the edge of both "
        "float32 targets: a one-row step reads 536 MB of weights (~13.4 ms at the full read "
        "rate).",
    ),
    Host(
        "amx: Intel(R) Xeon(R) Processor, ?, ?",
        "amx-a",
        "`amx`, host A: Intel Xeon (Sapphire Rapids class)",
        "A c=32 decode step reads the bf16 weights (270 MB) and the K/V of 32 requests (~141 MB) "
        "once; at this host's 19-20 GB/s that alone takes ~20 ms, which caps the share of its "
        "much faster AMX matmul.",
    ),
    Host(
        "amx: Intel(R) Xeon(R) Processor, 6/167/1, 491520 KB",
        "amx-b",
        "`amx`, host B: Intel Xeon with AMX, 480 MB L3",
        "At ~30 GB/s of reads the same bytes bound any server at ~20 % of this host's AMX "
        "ceiling (vLLM reaches 7-10 %).",
    ),
    Host("avx2: AMD EPYC, 25/1/1, 512 KB", "zen3", "`avx2`: AMD EPYC Zen 3"),
]

METHOD = """\
# Benchmarks

SmolLM2-135M-Instruct, 128-token prompts and 128 output tokens, on 2-vCPU cloud hosts. This page
is written by `benchmarks/report_page.py` from the JSON under
[`benchmarks/results/`](../benchmarks/results/); every run's detail (command, host, versions,
per-point figures) stays there.

**Method.**
- **An external client.** Every server is driven through HTTP (streaming `/v1/completions`) by
  the same load generator, `modelyard bench`, in a process of its own.
- **Side by side.** Each run serves modelyard, vLLM CPU 0.32 and llama.cpp (a bf16 GGUF) one
  after another on the same host, each with the host to itself, and reports ratios; these hosts
  drift by 10-30 % between minutes, so only ratios within one run compare, and each figure below
  is the median over the runs kept for that host. HTTP against the in-process engine
  (`serving.py`) alternates the two paths round by round.
- **Peers at their best settings**, in their own environments: vLLM with its Intel OpenMP
  preloaded, both cores and a 4 GiB KV cache; llama.cpp with 2 threads; none of modelyard's
  runtime settings. modelyard runs as configured by default.
- **Fresh prompts.** Every server and every concurrency point gets prompts of its own, so no
  prefix cache serves one point from another's prompts.
- **Ceilings measured next to the run.** "Share of the ceiling" divides the engine's bf16 rate
  by a 2048² matmul timed in the same process right before and after the c=32 run.
- **Memory** is the peak RSS of each server's whole process tree (vLLM's engine core and
  modelyard's engine worker are second processes).

**Host kinds** (`runner/kernel_config.py`), by what the runner's kernels use:

| kind | CPUs | bf16 GEMM at decode sizes | float32 GEMM |
|---|---|---|---|
| `amx` | Intel Sapphire / Emerald / Granite Rapids | AMX tiles | AVX-512 |
| `avx512-bf16` | AMD Zen 4 / 5, Intel Cooper Lake, Ice Lake+ servers | `vdpbf16ps` | AVX-512 |
| `avx512` | Intel Skylake-X / Cascade Lake | oneDNN | AVX-512 |
| `avx2` | other x86-64 since 2013 | bf16 weights widened to float32 as read | AVX2 |

**Reproduce.** `make setup`, then `benchmarks/setup_peers.sh PEERS_DIR` (vLLM CPU and llama.cpp
in side venvs, a bf16 GGUF), then `benchmarks/full_run.sh HOST [PEERS_DIR]` runs a host's whole
battery (~40 minutes on 2 cores) into `benchmarks/results/<kind>/HOST/` and ends with the
verdict. `python benchmarks/targets.py benchmarks/results/<kind>/HOST` gives the verdict alone,
and `python benchmarks/report_page.py` rewrites this page. The scripts, each runnable alone:
`engine_throughput.py` (the engine in-process against transformers, the textbook loop and vLLM's
offline generate, and the matmul ceiling), `compare_servers.py` (the servers through HTTP with
`modelyard bench`), `serving.py` (HTTP against in-process), `structured_serving.py` (requests
under a JSON Schema against unconstrained ones, with `vllm bench serve`), `gguf_serving.py` (a
GGUF served by modelyard and by llama.cpp's own server, with `vllm bench serve`; the model-shaped
file from `random_gguf.py`), `aiperf_crosscheck.py`
(`modelyard bench` against NVIDIA's aiperf), `kernel_ab.py` (two kernel builds in one process),
and those of [the other benchmarks](#other-benchmarks), e.g. `ray_routing.py [--replicas 3]`.
"""

VERDICT_HEAD = (
    "| target | needs | median (range) | runs meeting it | verdict |\n|---|---|---|---|---|"
)


@dataclass
class HostFigures:
    """The absolute figures of one host's compare_servers runs: (dtype, point, server, field)
    -> one value per run."""

    values: dict[tuple[str, str, str, str], list[float]] = field(default_factory=dict)
    times: list[str] = field(default_factory=list)

    def median(self, dtype: str, point: str, server: str, name: str) -> float | None:
        found = self.values.get((dtype, point, server, name))
        return statistics.median(found) if found else None


def host_figures(results: Path) -> dict[str, HostFigures]:
    """Per host label, the compare_servers figures of its default runs."""
    hosts: dict[str, HostFigures] = {}
    for _, kind, data in targets.default_runs([results]):
        figures = hosts.setdefault(targets.host_of(data["machine"]), HostFigures())
        figures.times.append(data["machine"].get("time") or "")
        if kind != "compare_servers":
            continue
        for server, found in data["servers"].items():
            for point, values in found.get("points", {}).items():
                for name in ("output_tok_s", "itl_p50_ms"):
                    if values.get(name) is not None:
                        key = (data["args"]["dtype"], point, server, name)
                        figures.values.setdefault(key, []).append(float(values[name]))
    return hosts


def _fill(text: str) -> str:
    return textwrap.fill(text, width=100, break_on_hyphens=False, break_long_words=False)


def verdict_table(rows: list[dict[str, Any]]) -> str:
    lines = [VERDICT_HEAD]
    for row in rows:
        needs = ("≥ " if row["at_least"] else "≤ ") + f"{row['threshold']:g}"
        spread = f"{row['median']:.2f} ({row['range'][0]:.2f}-{row['range'][1]:.2f})"
        met = "met" if row["met_by_median"] else "**not met**"
        counts = f"{row['runs_meeting']} of {row['runs']}"
        lines.append(f"| {row['text']} | {needs} | {spread} | {counts} | {met} |")
    return "\n".join(lines)


def _section(host: Host, rows: list[dict[str, Any]], figures: HostFigures) -> str:
    days = sorted(t[:10] for t in figures.times if t)
    missed = [r["text"] for r in rows if not r["met_by_median"]]
    verdict = (
        "Every target is met by the median."
        if not missed
        else "Not met by the median: " + "; ".join(missed) + "."
    )
    span = days[0] if days and days[0] == days[-1] else " to ".join(days[:: max(len(days) - 1, 1)])
    when = f"{len(figures.times)} result files, {span}" if days else "no runs"
    parts = [
        f"## {host.title}",
        "",
        _fill(f"CPU `{host.label}`; {when}. {verdict}"),
        "",
        verdict_table(rows),
        "",
        f"![{host.title}: modelyard, vLLM and llama.cpp](images/bench-{host.slug}.png)",
    ]
    if host.notes:
        parts += ["", _fill(host.notes)]
    return "\n".join(parts)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _point(servers: dict[str, Any], server: str, point: str, name: str) -> float | None:
    value = servers.get(server, {}).get("points", {}).get(point, {}).get(name)
    return float(value) if value is not None else None


# a column of the other configurations' table: (concurrency point, figure, the peer it divides by)
RATIOS = {
    "c32": ("32", "output_tok_s", "vllm"),
    "itl_vllm": ("1", "itl_p50_ms", "vllm"),
    "itl_llamacpp": ("1", "itl_p50_ms", "llamacpp"),
}


def _played_label(data: dict[str, Any]) -> str | None:
    machine, args = data.get("machine", {}), data.get("args", {})
    if machine.get("emulated"):
        return f"`{machine['emulated']['kind']}` played on `{machine.get('host_kind')}`"
    if args.get("weights"):
        return f"`--weights {args['weights']}` on `{machine.get('host_kind')}`"
    return None


def _other_runs(results: Path) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path in sorted(results.rglob("summary.json")):
        data = json.loads(path.read_text())
        label = _played_label(data)
        if label and path.parent.name.startswith("compare_servers"):
            yield label, data["args"]["dtype"], data["servers"]


def other_configurations(results: Path) -> str:
    """One row per (configuration, dtype): medians of the ratios over its runs."""
    cells: dict[tuple[str, str], dict[str, list[float]]] = {}
    for label, dtype, servers in _other_runs(results):
        row = cells.setdefault((label, dtype), {})
        for key, (p, name, peer) in RATIOS.items():
            value = _ratio(_point(servers, "modelyard", p, name), _point(servers, peer, p, name))
            if value is not None:
                row.setdefault(key, []).append(value)
    lines = [
        "| configuration | dtype | c=32 tok/s ÷ vLLM | c=1 ITL p50 ÷ vLLM "
        "| c=1 ITL p50 ÷ llama.cpp |",
        "|---|---|---|---|---|",
    ]
    for (label, dtype), row in sorted(cells.items()):
        shown = [
            f"{statistics.median(row[k]):.2f}× ({len(row[k])})" if k in row else "-"
            for k in ("c32", "itl_vllm", "itl_llamacpp")
        ]
        lines.append(f"| {label} | {dtype} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


OTHER_HEAD = """\
## Other configurations

Runs that played a lower kind on a higher host (`--emulate`: every system capped to the kind's
instructions; clock, caches and memory bandwidth stay the host's) and runs that served the
packaged GGUF file on its own Q4_1 blocks (`MODELYARD_WEIGHTS=gguf`, float32 activations)
against llama.cpp serving the same file. Medians, the number of runs in brackets; a played kind
keeps the host's clock and memory, so the real hosts above are the better guide.
"""


# README.md's headline table: its columns (title, host slugs) and rows (target key, label)
README = ROOT / "README.md"
README_MARK = "<!-- generated by benchmarks/report_page.py from benchmarks/results -->"
COLUMNS = [
    ("`amx` (Xeon)", ("amx-a", "amx-b")),
    ("`avx512-bf16` Zen 4", ("zen4",)),
    ("`avx512-bf16` Zen 5", ("zen5",)),
    ("`avx2` Zen 3", ("zen3",)),
]
HEADLINES = [
    ("http_c32_bfloat16", "c=32 output tok/s ÷ vLLM's, bf16"),
    ("http_c32_float32", "c=32 output tok/s ÷ vLLM's, float32"),
    ("itl_c1_bfloat16", "c=1 ITL p50 ÷ vLLM's, bf16"),
    ("itl_c1_llamacpp", "c=1 ITL p50 ÷ llama.cpp's, bf16"),
    ("rss_bfloat16", "peak RSS of the process tree ÷ vLLM's, bf16 c=32"),
]


def _all_verdicts(results: Path) -> dict[str, list[dict[str, Any]]]:
    return {
        host: targets.verdicts(host, values)
        for host, values in targets.read_results([results]).items()
    }


def headline_table(results: Path = RESULTS) -> str:
    """README.md's table: per target, each column's median (a range over several hosts)."""
    slugs = {host.slug: host.label for host in HOSTS}
    medians = {
        (host, row["key"]): row["median"]
        for host, rows in _all_verdicts(results).items()
        for row in rows
    }
    head = ["modelyard against the peer", "target", *(title for title, _ in COLUMNS)]
    lines = [f"| {' | '.join(head)} |", "|" + "---|" * len(head)]
    for key, label in HEADLINES:
        target = targets.TARGETS[key]
        cells = [label, ("≥ " if target.at_least else "≤ ") + f"{target.threshold:g}"]
        for _, hosts in COLUMNS:
            found = sorted(v for h in hosts if (v := medians.get((slugs[h], key))) is not None)
            low, high = (f"{found[0]:.2f}", f"{found[-1]:.2f}") if found else ("-", "-")
            cells.append(low if low == high else f"{low}-{high}")
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


def with_headline_table(readme: str, table: str) -> str:
    """readme with the table after README_MARK replaced by `table`."""
    head, mark, rest = readme.partition(README_MARK + "\n")
    if not mark:
        raise ValueError(f"README.md has no line {README_MARK!r}")
    old_end = rest.find("\n\n")
    return head + mark + table + rest[old_end if old_end >= 0 else len(rest) :]


def render(results: Path = RESULTS) -> str:
    """The whole page, from the result files under results."""
    verdicts = _all_verdicts(results)
    figures = host_figures(results)
    sections = [METHOD.rstrip()]
    for host in HOSTS:
        if host.label in verdicts:
            sections.append(_section(host, verdicts[host.label], figures[host.label]))
    structured = report_structured.section(results, link_prefix="../benchmarks/results/")
    if structured is not None:
        sections.append(structured)
    sections.append(OTHER_HEAD + "\n" + other_configurations(results))
    sections.append(report_other.section(results, link_prefix="../benchmarks/results/"))
    return "\n\n".join(sections) + "\n"


def write_plots(results: Path = RESULTS, images: Path = IMAGES) -> list[Path]:
    """One PNG per known host: c=32 output tok/s and c=1 ITL p50 by server and dtype."""
    import report_plots

    figures = host_figures(results)
    written = []
    for host in HOSTS:
        if host.label in figures:
            path = images / f"bench-{host.slug}.png"
            report_plots.plot_host(host.title.replace("`", ""), figures[host.label], path)
            written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args()
    text = render(args.results)
    readme = README.read_text()
    new_readme = with_headline_table(readme, headline_table(args.results))
    if args.check:
        stale = not args.page.exists() or args.page.read_text() != text or readme != new_readme
        print(f"{args.page}, {README.name}: {'stale' if stale else 'up to date'}")
        sys.exit(1 if stale else 0)
    args.page.write_text(text)
    README.write_text(new_readme)
    if not args.no_plots:
        for path in write_plots(args.results):
            print(f"wrote {path}")
    print(f"wrote {args.page} ({text.count(chr(10))} lines)")


if __name__ == "__main__":
    main()
