"""The per-host plot of docs/benchmarks.md (matplotlib, Agg backend: no display needed).

Two panels: c=32 output tok/s (higher is better) and c=1 ITL p50 (lower is better), one group
of bars per dtype, one bar per server, each the median over the host's runs. The PNG carries no
timestamp or version, so the same figures give the same file on the same matplotlib.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

if TYPE_CHECKING:
    from report_page import HostFigures

SERVERS = ("modelyard", "vllm", "llamacpp")
NAMES = {"modelyard": "modelyard", "vllm": "vLLM CPU", "llamacpp": "llama.cpp"}
COLORS = {"modelyard": "#1f77b4", "vllm": "#ff7f0e", "llamacpp": "#2ca02c"}
DTYPES = ("bfloat16", "float32")
PANELS = (  # (concurrency point, figure, title)
    ("32", "output_tok_s", "c=32: output tok/s (higher is better)"),
    ("1", "itl_p50_ms", "c=1: ITL p50, ms (lower is better)"),
)
WIDTH = 0.26


def plot_host(title: str, figures: HostFigures, path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, (point, name, panel) in zip(axes, PANELS, strict=True):
        for i, server in enumerate(SERVERS):
            xs, ys = [], []
            for j, dtype in enumerate(DTYPES):
                value = figures.median(dtype, point, server, name)
                if value is not None:
                    xs.append(j + (i - 1) * WIDTH)
                    ys.append(value)
            if not ys:
                continue
            bars = ax.bar(xs, ys, WIDTH, label=NAMES[server], color=COLORS[server])
            ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set_xticks(range(len(DTYPES)), DTYPES)
        ax.set_title(panel, fontsize=10)
        ax.margins(y=0.15)
    fullest = max(axes, key=lambda ax: len(ax.get_legend_handles_labels()[1]))
    if fullest.get_legend_handles_labels()[1]:
        fullest.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"{title} (medians over runs)", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
    return path
