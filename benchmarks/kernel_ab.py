"""The runner's kernels at two revisions, side by side in one process.

This host's speed drifts by 10-30 % from minute to minute, more than most kernel changes are
worth, so runs of two builds one after another cannot tell them apart. This script builds the
C++ kernels (`src/modelyard/runner/csrc`) of two git revisions, or of a revision and the working
tree, each under its own op and C++ namespace so both load into one process. It then times
them in alternation, each round running every case on both builds (base first in even rounds,
head first in odd ones).

The cases are the default model's decode-step work, with K/V and weights read from memory as
in the engine:
- **Decode attention**: 30 layers × 32 requests × 191 keys, float32 and bfloat16, with blocks
  laid out in order, scattered at random, or as the engine lays them. A request's prompt
  blocks are consecutive, and its later blocks are interleaved with the other requests' blocks.
- **Prompt attention**: a prefill step's 2048 rows (16 prompts of 128 tokens) over K/V in cache,
  float32 and bfloat16.
- **The bf16 GEMM shapes** (AVX-512 BF16 hosts) at 32, 8 and 1 rows: the fused q/k/v, o, the
  down projection over 30 layers' weights, and the lm_head.
- **The float32 GEMM shapes** at 32 rows and at 1 row, and SwiGLU's fused gate/up; and at a
  prefill step's 2048 rows (4 layers' weights).
- **The bf16 GEMM of hosts without AVX-512** (bf16 panels widened to float32) at 32 rows and 1.
- **The int8 and GGUF-block GEMMs** (opt-in weights; `kernel_ab_quant.py`) at 32, 8 and 1 rows.
- **The AMX GEMMs** (AMX hosts) over one decode step's bf16 weights in the engine's order, at
  32 rows and at 1 row.

It reports medians and quartiles per case and build. Each result is also compared bit for bit
with the base build's. Both builds run on ATen's threads, or with `--team` each inside its own
decode-step team (the helper thread is per library; each build's spins during its own run only),
as the engine's decode steps run: without it every parallel call also waits for OpenMP's
passive thread to wake (~30 us), which the engine does not.

    .venv/bin/python benchmarks/kernel_ab.py --base HEAD~1            # HEAD~1 vs working tree
    .venv/bin/python benchmarks/kernel_ab.py --base a908cda~1 --head a908cda --rounds 15

Both builds use the runner's compiler flags for the selected kind, so `MODELYARD_ISA=avx2`
(with the library caps of `kernel_config.LIBRARY_CAPS`) compares the AVX2 builds.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from modelyard.build_tools import path_with_ninja
from modelyard.engine.config import kernels_from_environment
from modelyard.runner import kernel_build

sys.path.insert(0, str(Path(__file__).parent))

from common import machine_info, write_json
from kernel_ab_quant import quant_cases

REPO = Path(__file__).resolve().parents[1]
CSRC = "src/modelyard/runner/csrc"
PREFILL_ROWS = 2048  # a prefill step's rows (max_num_batched_tokens)
LAYERS, KV_HEADS, HEAD_DIM, HEADS, REQUESTS, BLOCK, KEYS = 30, 3, 64, 9, 32, 16, 191


def build(tag: str, rev: str | None, root: Path) -> Any:
    """The kernels of `rev` (None: the working tree) loaded as torch.ops.ab_<tag>."""
    from torch.utils import cpp_extension

    out = root / tag
    out.mkdir(parents=True)
    names = (
        subprocess.run(
            ["git", "-C", str(REPO), "ls-tree", "--name-only", f"{rev}:{CSRC}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        if rev
        else [p.name for p in (REPO / CSRC).iterdir()]
    )
    for name in names:
        text = (
            subprocess.run(
                ["git", "-C", str(REPO), "show", f"{rev}:{CSRC}/{name}"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            if rev
            else (REPO / CSRC / name).read_text()
        )
        text = text.replace("modelyard_kernels", f"ab_{tag}")
        (out / name).write_text(re.sub(r"\bmodelyard\b", f"modelyard_{tag}", text))
    (out / "build").mkdir()
    cpp_extension.load(
        name=f"ab_{tag}",
        sources=[str(p) for p in sorted(out.glob("*.cpp"))],
        # the runner's flags for the kind (MODELYARD_ISA)
        extra_cflags=kernel_build.kind_flags(kernels_from_environment().isa),
        extra_ldflags=["-fopenmp"],
        build_directory=str(out / "build"),
        is_python_module=False,
        verbose=False,
    )
    return getattr(torch.ops, f"ab_{tag}")


def block_layouts() -> dict[str, torch.Tensor]:
    """(REQUESTS, blocks) block tables: in order, scattered, and as the engine lays them."""
    per = (KEYS + BLOCK - 1) // BLOCK
    ids = list(range(1, REQUESTS * per + 1))
    random.Random(0).shuffle(ids)
    prompt = 128 // BLOCK  # a 128-token prompt's blocks, then one block per 16 decode steps
    engine = [
        [1 + prompt * r + j for j in range(prompt)]
        + [1 + prompt * REQUESTS + (j - prompt) * REQUESTS + r for j in range(prompt, per)]
        for r in range(REQUESTS)
    ]
    return {
        "in_order": torch.arange(1, REQUESTS * per + 1).view(REQUESTS, per),
        "scattered": torch.tensor(ids).view(REQUESTS, per),
        "engine": torch.tensor(engine),
    }


def attention_cases(dtype: torch.dtype) -> dict[str, Callable[[Any], torch.Tensor]]:
    """Decode attention over 30 layers' caches, one case per block layout."""
    torch.manual_seed(0)
    blocks = REQUESTS * ((KEYS + BLOCK - 1) // BLOCK) + 1
    shape = (KV_HEADS, blocks, BLOCK, HEAD_DIM)
    k = [torch.randn(shape).to(dtype) for _ in range(LAYERS)]
    v = [torch.randn(shape).to(dtype) for _ in range(LAYERS)]
    q = [torch.randn(REQUESTS, HEADS, HEAD_DIM).to(dtype) for _ in range(LAYERS)]
    lens = torch.full((REQUESTS,), KEYS, dtype=torch.long)

    def case(tables: torch.Tensor) -> Callable[[Any], torch.Tensor]:
        def run(ops: Any) -> torch.Tensor:
            outs = [
                ops.paged_decode_attention(q[i], k[i], v[i], tables, lens, HEAD_DIM**-0.5, 0)
                for i in range(LAYERS)
            ]
            return torch.stack(outs)

        return run

    name = str(dtype).removeprefix("torch.")
    return {f"attention_{name}_{lay}": case(t) for lay, t in block_layouts().items()}


def prompt_attention_cases(dtype: torch.dtype) -> dict[str, Callable[[Any], torch.Tensor]]:
    """A prefill step's attention: 16 prompts of 128 tokens as 2048 rows (each row over keys
    [0, its position]), 30 layers' queries over one layer's K/V, which the step has just
    written (in cache, as in the engine)."""
    torch.manual_seed(5)
    prompts, length = PREFILL_ROWS // 128, 128
    per = length // BLOCK
    shape = (KV_HEADS, prompts * per + 1, BLOCK, HEAD_DIM)
    k, v = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    tables = torch.arange(1, prompts * per + 1).view(prompts, per).repeat_interleave(length, 0)
    lens = (torch.arange(length) + 1).repeat(prompts)
    q = [torch.randn(PREFILL_ROWS, HEADS, HEAD_DIM).to(dtype) for _ in range(LAYERS)]

    def run(ops: Any) -> torch.Tensor:
        outs = [
            ops.paged_decode_attention(q[i], k, v, tables, lens, HEAD_DIM**-0.5, 0)
            for i in range(LAYERS)
        ]
        return torch.stack(outs)

    return {f"prompt_attention_{str(dtype).removeprefix('torch.')}": run}


def gemm_cases(rows: int = REQUESTS) -> dict[str, Callable[[Any], torch.Tensor]]:
    """The bf16 GEMM at `rows` rows over 30 layers' weights (packed by each build itself), and
    SwiGLU's fused gate/up."""
    torch.manual_seed(1)
    shapes = {"qkv": (960, 576, LAYERS), "o": (576, 576, LAYERS), "down": (576, 1536, LAYERS)}
    shapes["lm_head"] = (49152, 576, 1)
    cases: dict[str, Callable[[Any], torch.Tensor]] = {}
    for name, (n, k, count) in shapes.items():
        weights = [torch.randn(n, k).bfloat16() for _ in range(count)]
        x = torch.randn(rows, k).bfloat16()
        packed: dict[int, list[torch.Tensor]] = {}

        def run(ops: Any, n: int = n, x: torch.Tensor = x, weights: list[torch.Tensor] = weights,
                packed: dict[int, list[torch.Tensor]] = packed) -> torch.Tensor:  # fmt: skip
            if id(ops) not in packed:  # packed once per build (the untimed first round)
                packed[id(ops)] = [ops.pack_bf16(w) for w in weights]
            mine = packed[id(ops)]
            return torch.stack([ops.packed_linear_bf16(x, p, n) for p in mine])

        cases[f"gemm_bf16_{name}" + ("" if rows == REQUESTS else f"_m{rows}")] = run
    name = "swiglu_bf16" + ("" if rows == REQUESTS else f"_m{rows}")
    cases[name] = swiglu_case(
        rows, LAYERS, torch.bfloat16, "pack_swiglu_bf16", "packed_swiglu_bf16"
    )
    return cases


def swiglu_case(
    rows: int, layers: int, dtype: torch.dtype, pack: str, gemm: str
) -> Callable[[Any], torch.Tensor]:
    """SwiGLU's fused gate/up (1536 x 576 each) at `rows` rows over `layers` layers' weights,
    packed by each build's `pack` op and run by its `gemm` op."""
    gates = [(torch.randn(1536, 576, dtype=dtype), torch.randn(1536, 576, dtype=dtype))
             for _ in range(layers)]  # fmt: skip
    xs = torch.randn(rows, 576, dtype=dtype)
    packed: dict[int, list[torch.Tensor]] = {}

    def run(ops: Any) -> torch.Tensor:
        if id(ops) not in packed:
            packed[id(ops)] = [getattr(ops, pack)(g, u) for g, u in gates]
        return torch.stack([getattr(ops, gemm)(xs, p, 1536) for p in packed[id(ops)]])

    return run


def fp32_gemm_cases(rows: int, layers: int = LAYERS) -> dict[str, Callable[[Any], torch.Tensor]]:
    """The float32 GEMM at `rows` rows over `layers` layers' weights, and SwiGLU's gate/up; at
    decode sizes also the lm_head (113 MB)."""
    torch.manual_seed(2)
    shapes = {"qkv": (960, 576), "o": (576, 576), "down": (576, 1536)}
    if rows <= REQUESTS:
        shapes["lm_head"] = (49152, 576)
    cases: dict[str, Callable[[Any], torch.Tensor]] = {}
    for name, (n, k) in shapes.items():
        weights = [torch.randn(n, k) for _ in range(1 if name == "lm_head" else layers)]
        x = torch.randn(rows, k)
        packed: dict[int, list[torch.Tensor]] = {}

        def run(ops: Any, n: int = n, x: torch.Tensor = x, weights: list[torch.Tensor] = weights,
                packed: dict[int, list[torch.Tensor]] = packed) -> torch.Tensor:  # fmt: skip
            if id(ops) not in packed:
                packed[id(ops)] = [ops.pack_weight(w) for w in weights]
            return torch.stack([ops.packed_linear(x, p, n, None) for p in packed[id(ops)]])

        cases[f"gemm_fp32_{name}_m{rows}"] = run
    cases[f"swiglu_fp32_m{rows}"] = swiglu_case(
        rows, layers, torch.float32, "pack_swiglu", "packed_swiglu"
    )
    return cases


def bf16w_cases(rows: int) -> dict[str, Callable[[Any], torch.Tensor]]:
    """The bf16 GEMM of hosts without AVX-512 (runner.bf16_widen) at `rows` rows over 30
    layers' weights of each shape (the gate/up pair as one weight), and the lm_head."""
    from modelyard.runner import bf16_widen

    torch.manual_seed(4)
    shapes = {"qkv": (960, 576), "gate_up": (3072, 576), "down": (576, 1536)}
    cases: dict[str, Callable[[Any], torch.Tensor]] = {}
    for name, (n, k) in {**shapes, "lm_head": (49152, 576)}.items():
        count = 1 if name == "lm_head" else LAYERS
        packed = [bf16_widen.pack(torch.randn(n, k).bfloat16()) for _ in range(count)]
        x = torch.randn(rows, k).bfloat16()

        def run(ops: Any, n: int = n, x: torch.Tensor = x,
                packed: list[torch.Tensor] = packed) -> torch.Tensor:  # fmt: skip
            return torch.stack([ops.packed_linear_bf16w(x, p, n, None) for p in packed])

        cases[f"gemm_bf16w_{name}_m{rows}"] = run
    return cases


def amx_cases(rows: int) -> dict[str, Callable[[Any], torch.Tensor]]:
    """The AMX GEMMs over one decode step's bf16 weights in the engine's order (per layer q/k/v,
    o, SwiGLU's gate/up, down; then the lm_head), at `rows` rows: 270 MB, read from memory."""
    torch.manual_seed(3)
    layer = [("qkv", 960, 576), ("o", 576, 576), ("swiglu", 1536, 576), ("down", 576, 1536)]
    shapes = layer * LAYERS + [("lm_head", 49152, 576)]
    weights = [(name, n, torch.randn(n, k).bfloat16()) for name, n, k in shapes]
    xs = {k: torch.randn(rows, k).bfloat16() for k in (576, 1536)}
    packed: dict[int, list[tuple[str, int, torch.Tensor]]] = {}

    def pack(ops: Any, name: str, w: torch.Tensor) -> torch.Tensor:
        if name == "swiglu":  # gate and up: the two halves of one random weight's rows
            return ops.pack_swiglu_bf16(w, w.flip(0))  # type: ignore[no-any-return]
        return ops.pack_bf16(w)  # type: ignore[no-any-return]

    def run(ops: Any) -> torch.Tensor:
        if id(ops) not in packed:
            packed[id(ops)] = [(name, n, pack(ops, name, w)) for name, n, w in weights]
        outs = []
        for name, n, p in packed[id(ops)]:
            x = xs[2 * p.size(-3)]
            gemm = ops.packed_swiglu_amx if name == "swiglu" else ops.packed_linear_amx
            outs.append(gemm(x, p, n)[:, :8])
        return torch.cat(outs, dim=1)

    return {f"amx_step_m{rows}": run}


def _has_amx(ops: Any) -> bool:
    try:
        return bool(ops.amx_ready())
    except (AttributeError, RuntimeError):
        return False


def _has_bf16_gemm(ops: Any) -> bool:
    try:
        return bool(ops.bf16_gemm_supported())
    except (AttributeError, RuntimeError):  # a revision before the bf16 GEMM
        return False


def timed_run(run: Callable[[Any], torch.Tensor], ops: Any, *, team: bool) -> torch.Tensor:
    """run(ops), inside that build's decode-step team when `team`."""
    if not team:
        return run(ops)
    ops.team_begin()
    try:
        return run(ops)
    finally:
        ops.team_end()


def main() -> None:
    os.environ["PATH"] = path_with_ninja(os.environ)  # this script's config layer: its builds
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="git revision of the first build")
    parser.add_argument("--head", default=None, help="git revision of the second (default: tree)")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--out", default="kernel_ab")
    parser.add_argument("--cases", default="", help="a regex: only the cases it finds")
    parser.add_argument(
        "--team",
        action="store_true",
        help="run each case inside the build's decode-step team (its helper thread spins during "
        "that build's run only), as the engine's decode steps do",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        builds = {
            "base": build("base", args.base, Path(tmp)),
            "head": build("head", args.head, Path(tmp)),
        }
        cases = {**attention_cases(torch.float32), **attention_cases(torch.bfloat16)}
        cases.update(prompt_attention_cases(torch.float32))
        cases.update(prompt_attention_cases(torch.bfloat16))
        if all(_has_bf16_gemm(b) for b in builds.values()):
            cases.update(gemm_cases())
            cases.update(gemm_cases(8))  # a speculative verify step's rows, or 8 requests
            cases.update(gemm_cases(1))
        if all(_has_amx(b) for b in builds.values()):
            cases.update(amx_cases(REQUESTS))
            cases.update(amx_cases(1))
        cases.update(fp32_gemm_cases(REQUESTS))
        cases.update(fp32_gemm_cases(1))
        cases.update(fp32_gemm_cases(PREFILL_ROWS, layers=4))
        if all(hasattr(b, "packed_linear_bf16w") for b in builds.values()):
            cases.update(bf16w_cases(REQUESTS))
            cases.update(bf16w_cases(1))
        cases.update(quant_cases(builds))
        cases = {name: run for name, run in cases.items() if re.search(args.cases, name)}
        for run in cases.values():  # untimed: packing, first touches
            for ops in builds.values():
                run(ops)
        times: dict[str, dict[str, list[float]]] = {c: {b: [] for b in builds} for c in cases}
        same: dict[str, bool] = {}
        for round_ in range(args.rounds):
            order = list(builds.items())[:: 1 if round_ % 2 == 0 else -1]  # no fixed first
            for case, run in cases.items():
                outs = {}
                for name, ops in order:
                    start = time.perf_counter()
                    outs[name] = timed_run(run, ops, team=args.team)
                    times[case][name].append((time.perf_counter() - start) * 1e3)
                same[case] = same.get(case, True) and torch.equal(outs["base"], outs["head"])
    results: dict[str, Any] = {}
    for case, per_build in times.items():
        row: dict[str, Any] = {"same_bits": same[case]}
        for name, values in per_build.items():
            values.sort()
            quarter = len(values) // 4
            row[name] = {
                "median_ms": round(values[len(values) // 2], 3),
                "p25_ms": round(values[quarter], 3),
                "p75_ms": round(values[-1 - quarter], 3),
            }
        row["head_vs_base"] = round(row["head"]["median_ms"] / row["base"]["median_ms"], 3)
        results[case] = row
        base, head = row["base"]["median_ms"], row["head"]["median_ms"]
        print(
            f"{case:32s} base {base:8.3f} ms  head {head:8.3f} ms  x{row['head_vs_base']:.3f}"
            f"  same bits: {row['same_bits']}"
        )
    payload = {
        "args": vars(args),
        "machine": machine_info(),
        "threads": torch.get_num_threads(),
        "results": results,
    }
    print("wrote", write_json(args.out, payload))


if __name__ == "__main__":
    main()
