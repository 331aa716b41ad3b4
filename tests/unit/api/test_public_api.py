"""The public surface stays: `modelyard.__all__`, the CLI's subcommands, the HTTP routes."""

from __future__ import annotations

import argparse

import pytest
from starlette.routing import Match

import modelyard
from fakes.models import FakeProvider
from modelyard import cli
from modelyard.api.app import build_app
from modelyard.config import ModelyardConfig

pytestmark = pytest.mark.unit

ROUTES = {
    ("GET", "/health"),
    ("GET", "/ready"),
    ("GET", "/metrics"),
    ("GET", "/models"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("POST", "/basic_generate"),
    ("POST", "/generate"),
    ("POST", "/generate_stream"),
    ("POST", "/generate_vllm"),
    ("POST", "/predict"),
    ("GET", "/v2"),
    ("GET", "/v2/health/live"),
    ("GET", "/v2/health/ready"),
    ("GET", "/v2/models/{name}"),
    ("GET", "/v2/models/{name}/versions/{version}"),
    ("GET", "/v2/models/{name}/ready"),
    ("GET", "/v2/models/{name}/versions/{version}/ready"),
    ("POST", "/v2/models/{name}/infer"),
    ("POST", "/v2/models/{name}/versions/{version}/infer"),
    ("POST", "/v2/repository/index"),
    ("POST", "/v2/repository/models/{name}/load"),
    ("POST", "/v2/repository/models/{name}/unload"),
    ("GET", "/admin/usage"),
    ("GET", "/debug/engine_stats"),
}


def test_package_exports_exactly_the_public_api() -> None:
    assert sorted(modelyard.__all__) == ["LLM", "SamplingParams", "__version__"]
    for name in modelyard.__all__:
        assert getattr(modelyard, name) is not None
    assert modelyard.LLM.__module__ == "modelyard.engine.llm"
    assert modelyard.SamplingParams(max_tokens=3).max_tokens == 3
    with pytest.raises(AttributeError):
        modelyard.Engine  # type: ignore[attr-defined]  # noqa: B018


def test_cli_has_its_subcommands() -> None:
    parser = cli.build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(subparsers.choices) == {"serve", "bench", "models", "keys", "agent"}
    serve = cli.build_parser("serve").parse_args(["serve", "--port", "9001"])
    assert (serve.command, serve.port, serve._module) == ("serve", 9001, "modelyard.api.cli")


def test_cli_help_exits_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    assert "{serve,bench,models,keys,agent}" in capsys.readouterr().out


def test_http_routes_stay() -> None:
    app = build_app(FakeProvider({}), ModelyardConfig())

    def served(method: str, path: str) -> bool:
        concrete = path.replace("{name}", "m").replace("{version}", "1")
        scope = {"type": "http", "method": method, "path": concrete, "root_path": ""}
        return any(route.matches(scope)[0] is Match.FULL for route in app.router.routes)

    assert [route for route in sorted(ROUTES) if not served(*route)] == []
