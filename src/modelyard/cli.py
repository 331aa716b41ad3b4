"""`modelyard` command line: serve | bench | models | keys | agent.

Each subcommand lives with the component it drives, in a module that exposes
`add_arguments(parser)` and `run(args) -> int`; this file only dispatches. Modules are imported
when their subcommand is parsed, so `modelyard keys` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("modelyard.api.cli", "start the HTTP server on a catalog of models"),
    "bench": ("modelyard.bench.cli", "load-test an OpenAI-compatible or KServe endpoint"),
    "models": ("modelyard.manager.cli", "list or check the models of a catalog"),
    "keys": ("modelyard.gateway.cli", "create, list and revoke API keys"),
    "agent": ("modelyard.agent.cli", "RAG / CAG knowledge agent over a modelyard server"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or (only=NAME) one whose other subcommands are not imported."""
    parser = argparse.ArgumentParser(prog="modelyard", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text)
        if only is None or name == only:
            importlib.import_module(module_name).add_arguments(sub)
        sub.set_defaults(_module=module_name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    only = chosen if chosen in SUBCOMMANDS else "-"  # "-": import none for top-level help
    args = build_parser(only).parse_args(argv)
    module = importlib.import_module(args._module)
    result: int = module.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
