"""`modelyard models`: list the models of a catalog (the embedded default or --catalog FILE);
`--check` verifies each source exists (and that an LLM's engine / a backend is known) without
loading any weights. Exit code 1 when a check fails."""

from __future__ import annotations

import argparse
import json
import sys

from modelyard.backends import BACKENDS
from modelyard.manager.catalog import Catalog, load_catalog
from modelyard.manager.loaders import estimate_bytes
from modelyard.model_spec import ModelSpec
from modelyard.sources import resolve_source

_PACKAGED_KEYS = {"efficientnet-lite0"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--catalog", default=None, help="catalog YAML/JSON (default: embedded)")
    parser.add_argument("--check", action="store_true", help="verify every model's source")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def check_spec(spec: ModelSpec) -> str | None:
    """A problem with the spec's source or backend, or None."""
    if not spec.kind.is_llm and spec.backend not in BACKENDS:
        return f"unknown backend {spec.backend!r}"
    if spec.backend == "triton" or spec.source in _PACKAGED_KEYS:
        return None
    try:
        resolve_source(spec.source)
    except (FileNotFoundError, ValueError) as exc:
        return str(exc)
    return None


def run(args: argparse.Namespace) -> int:
    try:
        catalog: Catalog = load_catalog(args.catalog)
    except (OSError, ValueError) as exc:
        print(f"modelyard models: {exc}", file=sys.stderr)
        return 2
    rows = []
    failed = False
    for spec in catalog:
        problem = check_spec(spec) if args.check else None
        failed = failed or problem is not None
        rows.append(
            {
                "id": spec.id,
                "kind": str(spec.kind),
                "backend": spec.backend,
                "source": spec.source,
                "estimate_mib": round(estimate_bytes(spec) / 2**20),
                "flags": ",".join(f for f in ("pin", "preload") if getattr(spec, f)),
                "check": ("ok" if problem is None else f"FAILED: {problem}") if args.check else "",
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            line = f"{row['id']:<26} {row['kind']:<26} {row['backend']:<12}"
            line += f" ~{row['estimate_mib']:>5} MiB"
            print(f"{line}  {row['flags']:<12} {row['check']}".rstrip())
    return 1 if failed else 0
