"""`POST /v1/agent/ask` without sockets: its settings checked when the config is read, its
refusals in the OpenAI envelope. The answering path (the agent calling the server back) is an
e2e test (tests/e2e/ui/test_console_e2e.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from api_helpers import make_client

from fakes.llm import FakeLLM
from fakes.models import FakeProvider
from modelyard.api.app import build_app
from modelyard.config import ModelyardConfig, config_from_mapping

pytestmark = pytest.mark.unit


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider({"m": FakeLLM(name="m")})


def test_the_agent_section_is_checked_when_read() -> None:
    config = config_from_mapping({"agent": {"index": "/x", "chat_model": "m", "refine": False}})
    assert config.agent.index == "/x"
    assert config.agent.settings.chat_model == "m"
    assert config.agent.settings.refine is False
    with pytest.raises(ValueError, match="top_p"):
        config_from_mapping({"agent": {"top_p": 0.5}})
    with pytest.raises(ValueError, match="max_tokens"):
        config_from_mapping({"agent": {"max_tokens": 0}})
    assert (
        config_from_mapping({"agent": {"retrieval": "tools"}}).agent.settings.retrieval == "tools"
    )
    with pytest.raises(ValueError, match=r"agent\.retrieval"):
        config_from_mapping({"agent": {"retrieval": "grep"}})


async def test_without_an_index_the_answer_says_how_to_make_one(
    provider: FakeProvider, tmp_path: Path
) -> None:
    config = config_from_mapping({"agent": {"index": str(tmp_path / "none")}})
    async with make_client(build_app(provider, config)) as client:
        response = await client.post("/v1/agent/ask", json={"question": "Why?"})
    assert response.status_code == 404
    assert "modelyard agent ingest" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"question": ""}, "question"),
        ({"question": "Why?", "mode": "guess"}, "mode"),
        ({"question": "Why?", "top_k": 0}, "top_k"),
        ({"question": "Why?", "retrieval": "grep"}, "retrieval"),
        ({"question": "Why?", "index": "/etc"}, "index"),  # no request names a server path
    ],
)
async def test_bad_questions_get_400(
    provider: FakeProvider, body: dict[str, object], param: str
) -> None:
    async with make_client(build_app(provider, ModelyardConfig())) as client:
        response = await client.post("/v1/agent/ask", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
