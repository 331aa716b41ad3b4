"""`python -m modelyard.runner.kernels`: build this host's kernels (default), every kind's into
a folder (`--prebuild DIR`, as the image does), or print the `KernelState` as JSON (`--report`).

This command is its process's config layer: it reads the kernel switches from the environment
(`MODELYARD_*`, runner.kernel_config) and puts ninja on its own PATH for torch's builder
(modelyard.build_tools); scripts/setup runs it.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import msgspec

from modelyard.build_tools import path_with_ninja
from modelyard.engine.config import kernels_from_environment
from modelyard.runner import kernels
from modelyard.runner.kernel_build import prebuild
from modelyard.runner.kernel_config import KINDS


def main(argv: list[str] | None = None) -> int:
    """Build this host's kernels (default), every kind's into a folder, or report the state."""
    parser = argparse.ArgumentParser(prog="python -m modelyard.runner.kernels")
    parser.add_argument("--prebuild", type=Path, help="build every kind into this folder")
    parser.add_argument("--kinds", default=",".join(KINDS), help="with --prebuild (comma list)")
    parser.add_argument("--report", action="store_true", help="print the KernelState as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.report else logging.INFO)
    os.environ["PATH"] = path_with_ninja(os.environ)  # torch's builder runs ninja from PATH
    if args.prebuild is not None:
        wanted = set(args.kinds.split(","))
        if not wanted <= set(KINDS):
            parser.error(f"--kinds: one or more of {', '.join(KINDS)}, not {args.kinds!r}")
        for path in prebuild(args.prebuild, [kind for kind in KINDS if kind in wanted]):
            print(path)
        return 0
    config = kernels_from_environment()
    loaded = kernels.state(config)
    if args.report:
        print(msgspec.json.encode(loaded).decode())
        return 0
    print(f"modelyard kernels for {config.isa}: {loaded.kind} ({loaded.source})")
    return 0  # a failed build was logged; the torch path still serves (scripts/setup goes on)


if __name__ == "__main__":
    raise SystemExit(main())
