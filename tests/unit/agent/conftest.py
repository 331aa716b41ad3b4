"""Fixtures of the knowledge agent's unit tests: a fake server and an agent that talks to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from agent_fakes import FakeServer

from modelyard.agent import AgentConfig, KnowledgeAgent, ModelyardAPI


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


@pytest.fixture
async def agent(server: FakeServer, tmp_path: Path) -> AsyncIterator[KnowledgeAgent]:
    api = ModelyardAPI("http://fake", transport=httpx.MockTransport(server.handle))
    config = AgentConfig(chunk_words=40, overlap_words=10, top_k=3)
    yield KnowledgeAgent(api, tmp_path / "index", config)
    await api.aclose()
