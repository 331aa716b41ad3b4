"""`/ready` carries the runner's kernel state (null until the startup check answers), whatever
the status: ready, loading or failed."""

from __future__ import annotations

import asyncio

import pytest
from api_helpers import make_client

from fakes.models import FakeProvider
from modelyard.api.app import build_app
from modelyard.config import ModelyardConfig
from modelyard.runner.kernel_config import KernelState

pytestmark = pytest.mark.unit


async def test_ready_shows_the_kernels(provider: FakeProvider) -> None:
    app = build_app(provider, ModelyardConfig())
    async with make_client(app) as client:
        assert (await client.get("/ready")).json() == {"status": "ready", "kernels": None}
        app.state.kernels = KernelState(kind="avx2", source="prebuilt")
        body = (await client.get("/ready")).json()
    assert body == {
        "status": "ready",
        "kernels": {"kind": "avx2", "source": "prebuilt", "error": None},
    }


async def test_loading_and_failed_answers_show_them_too(provider: FakeProvider) -> None:
    release = asyncio.Event()

    async def startup() -> None:
        await release.wait()
        raise RuntimeError("boom")

    app = build_app(provider, ModelyardConfig(), startup=startup)
    app.state.kernels = KernelState(kind="none", source="prebuilt", error="no library in /opt")
    async with app.router.lifespan_context(app), make_client(app) as client:
        loading = await client.get("/ready")
        release.set()
        for _ in range(100):
            if app.state.startup_error is not None:
                break
            await asyncio.sleep(0.01)
        failed = await client.get("/ready")
    assert (loading.status_code, loading.json()["status"]) == (503, "loading")
    assert loading.json()["kernels"]["error"] == "no library in /opt"
    assert (failed.status_code, failed.json()["status"]) == (503, "failed")
    assert failed.json()["kernels"]["kind"] == "none"
