"""Fixtures of the API unit tests (the fakes live in tests/fakes/)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from api_helpers import make_client

from fakes.llm import FakeLLM
from fakes.models import FakeProvider
from modelyard.api.app import build_app
from modelyard.config import ModelyardConfig


@pytest.fixture
def llm() -> FakeLLM:
    return FakeLLM(name="m")


@pytest.fixture
def provider(llm: FakeLLM) -> FakeProvider:
    return FakeProvider({"m": llm, "smollm2-135m-instruct": llm})


@pytest.fixture
async def client(provider: FakeProvider) -> AsyncIterator[httpx.AsyncClient]:
    app = build_app(provider, ModelyardConfig())
    async with make_client(app) as c:
        yield c
