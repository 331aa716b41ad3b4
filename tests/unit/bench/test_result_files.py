"""benchmarks/common.py write_json: every result file says which command made it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

sys.path.insert(0, str(Path(__file__).parents[3] / "benchmarks"))
import common  # noqa: E402


def test_every_result_records_its_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(common, "results_dir", lambda: tmp_path)
    monkeypatch.setattr(sys, "argv", ["benchmarks/serving.py", "--dtype", "bfloat16"])
    plain = json.loads(common.write_json("plain", {"ratios": {}}).read_text())
    assert plain == {"command": "python benchmarks/serving.py --dtype bfloat16", "ratios": {}}
    own = json.loads(common.write_json("own", {"command": "python x.py --y"}).read_text())
    assert own == {"command": "python x.py --y"}  # a script's own command line stays
