"""Ray is an optional extra: the CLI parses `--ray` and single-node serving never imports it."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_single_node_serve_does_not_import_ray() -> None:
    code = (
        "import sys; from modelyard.cli import build_parser; "
        "args = build_parser('serve').parse_args(['serve', '--ray', '--address', 'h:1']); "
        "assert args.ray and args.address == 'h:1'; "
        "import modelyard.api.app; assert 'ray' not in sys.modules, 'ray imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
