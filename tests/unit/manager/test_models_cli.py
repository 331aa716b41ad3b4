from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from modelyard.manager import cli

pytestmark = pytest.mark.unit


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(list(argv)))


def test_lists_the_default_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    assert run() == 0
    out = capsys.readouterr().out
    assert "smollm2-135m-instruct" in out
    assert "efficientnet-lite0-onnx" in out


def test_check_flags_a_missing_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    catalog = tmp_path / "catalog.yaml"
    models = [
        {"id": "ok", "kind": "embedding", "backend": "echo", "source": str(tmp_path)},
        {"id": "gone", "kind": "embedding", "backend": "echo", "source": str(tmp_path / "no")},
    ]
    catalog.write_text(yaml.safe_dump({"models": models}))
    assert run("--catalog", str(catalog), "--check") == 1
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["ok"].endswith("ok")
    assert "FAILED" in lines["gone"]
