"""The console's routes over the real app with a fake provider: static files open, traversal
refused, the summary's shape and what each viewer may see."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from api_helpers import make_client
from fastapi import APIRouter, FastAPI

from fakes.llm import FakeLLM
from fakes.models import FakeProvider
from modelyard.api.app import build_app
from modelyard.api.routes.console import UI_ROOT, _serves, models_with_state
from modelyard.config import ModelyardConfig, config_from_mapping
from modelyard.gateway.keys import SqliteKeyStore, new_record
from modelyard.observability.metrics import TIME_TO_FIRST_TOKEN

pytestmark = pytest.mark.unit


class ListingProvider(FakeProvider):
    """A provider whose /models listing looks like the manager's."""

    def describe(self) -> dict[str, Any]:
        return {
            "available_models": [
                {"id": "chat-a", "kind": "chat", "pin": True, "state": "loaded"},
                {"id": "img-b", "kind": "image-classification", "pin": False, "state": "unloaded"},
            ],
            "loaded_models": [
                {"id": "chat-a", "state": "loaded", "memory_bytes": 123, "engine": {"x": 1}}
            ],
            "memory": {"budget_bytes": 1000, "used_bytes": 123, "reserved_bytes": 0},
        }


@pytest.fixture
def provider() -> ListingProvider:
    return ListingProvider({"chat-a": FakeLLM(name="chat-a")})


async def test_shell_and_files_are_served(provider: ListingProvider) -> None:
    async with make_client(build_app(provider, ModelyardConfig())) as client:
        redirect = await client.get("/ui")
        assert redirect.status_code == 307
        assert redirect.headers["location"] == "/ui/"
        index = await client.get("/ui/")
        assert index.status_code == 200
        assert index.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in index.headers["content-security-policy"]
        assert index.text == (UI_ROOT / "index.html").read_text()
        script = await client.get("/ui/static/js/main.js")
        assert script.status_code == 200
        assert script.headers["content-type"].startswith("text/javascript")
        head = await client.head("/ui/static/console.css")
        assert head.status_code == 200
        assert head.headers["content-type"].startswith("text/css")


def test_every_file_the_page_references_exists() -> None:
    index = (UI_ROOT / "index.html").read_text()
    for ref in ("static/console.css", "static/js/main.js", "static/favicon.svg"):
        assert ref in index
        assert (UI_ROOT / ref).is_file()
    for script in (UI_ROOT / "static" / "js").glob("*.js"):
        for line in script.read_text().splitlines():
            if line.startswith("import ") and ' from "./' in line:
                name = line.split(' from "./')[1].split('"')[0]
                assert (script.parent / name).is_file(), f"{script.name} imports {name}"


@pytest.mark.parametrize(
    "path",
    [
        "/ui/static/%2E%2E/index.html",  # percent-encoded: the client does not fold the dots
        "/ui/static/..%2F..%2Fapp.py",
        "/ui/static/js/%2E%2E/%2E%2E/%2E%2E/api/app.py",
        "/ui/static/missing.js",
        "/ui/static/",
    ],
)
async def test_only_shipped_files_are_served(provider: ListingProvider, path: str) -> None:
    async with make_client(build_app(provider, ModelyardConfig())) as client:
        response = await client.get(path)
    assert response.status_code == 404
    assert "import" not in response.text


async def test_summary_shape_with_auth_off(provider: ListingProvider) -> None:
    TIME_TO_FIRST_TOKEN.labels(model="chat-a", tenant="t1").observe(0.02)
    TIME_TO_FIRST_TOKEN.labels(model="chat-a", tenant="t2").observe(0.3)
    async with make_client(build_app(provider, ModelyardConfig())) as client:
        body = (await client.get("/ui/api/summary")).json()
    assert body["viewer"] == {"tenant": "anonymous", "admin": True, "auth": False}  # sees all
    assert [m["id"] for m in body["models"]] == ["chat-a", "img-b"]
    chat = body["models"][0]
    assert chat["memory_bytes"] == 123
    assert chat["engine"] == {"x": 1}
    assert chat["status"] == "loaded"
    assert body["memory"]["budget_bytes"] == 1000
    ttft = body["metrics"]["chat-a"]["ttft"]  # both tenants' series added together
    assert ttft["le"][-1] == "+Inf"
    assert ttft["count"] >= 2
    assert ttft["counts"][-1] == ttft["count"]


def test_a_model_unloaded_after_an_eviction_is_evicted() -> None:
    listing = {
        "available_models": [{"id": "a", "state": "unloaded"}, {"id": "b", "state": "unloaded"}],
        "loaded_models": [],
    }
    statuses = [m["status"] for m in models_with_state(listing, {"a": 2.0})]
    assert statuses == ["evicted", "unloaded"]


async def test_summary_counts_the_requests_each_model_served(provider: ListingProvider) -> None:
    chat = {"model": "chat-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with make_client(build_app(provider, ModelyardConfig())) as client:
        before = (await client.get("/ui/api/summary")).json()["metrics"]
        for _ in range(2):
            assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
        after = (await client.get("/ui/api/summary")).json()["metrics"]
    assert after["chat-a"]["requests"] - before.get("chat-a", {}).get("requests", 0) == 2


def _auth_config(tmp_path: Path) -> tuple[ModelyardConfig, dict[str, str]]:
    store = SqliteKeyStore(tmp_path / "keys.db")
    keys = {}
    for name, admin, models in (
        ("acme", False, None),
        ("globex", False, ("img-b",)),
        ("ops", True, None),
    ):
        key, record = new_record(name, admin=admin, models=models)
        store.add(record)
        keys[name] = key
    gateway = {"auth": "on", "keys": {"backend": "sqlite", "sqlite_path": str(store.path)}}
    return config_from_mapping({"gateway": gateway}), keys


async def test_with_auth_the_shell_is_open_and_the_data_needs_a_key(
    provider: ListingProvider, tmp_path: Path
) -> None:
    config, _ = _auth_config(tmp_path)
    async with make_client(build_app(provider, config)) as client:
        assert (await client.get("/ui/")).status_code == 200
        assert (await client.get("/ui/static/js/api.js")).status_code == 200
        assert (await client.get("/ui/static/%2E%2E/%2E%2E/v1/models")).status_code == 404
        refused = await client.get("/ui/api/summary")
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
        wrong = await client.get("/ui/api/summary", headers=_bearer("my-wrong"))
        assert wrong.status_code == 401


async def test_a_tenant_sees_its_own_usage_and_an_admin_every_tenant(
    provider: ListingProvider, tmp_path: Path
) -> None:
    config, keys = _auth_config(tmp_path)
    async with make_client(build_app(provider, config)) as client:
        for tenant in ("acme", "globex"):  # usage is recorded for every admitted request
            assert (await client.get("/models", headers=_bearer(keys[tenant]))).is_success
        acme = (await client.get("/ui/api/summary", headers=_bearer(keys["acme"]))).json()
        admin = (await client.get("/ui/api/summary", headers=_bearer(keys["ops"]))).json()
    assert acme["viewer"] == {"tenant": "acme", "admin": False, "auth": True}
    assert set(acme["usage"]["tenants"]) == {"acme"}
    assert acme["usage"]["tenants"]["acme"]["requests"] >= 2  # /models and the summary
    assert admin["viewer"] == {"tenant": "ops", "admin": True, "auth": True}
    assert {"acme", "globex", "ops"} <= set(admin["usage"]["tenants"])
    assert [m["id"] for m in acme["models"]] == ["chat-a", "img-b"]


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def test_features_tell_which_optional_apis_are_served(provider: ListingProvider) -> None:
    async with make_client(build_app(provider, ModelyardConfig())) as client:
        features = (await client.get("/ui/api/summary")).json()["features"]
    assert features == {"prefixes": True, "agent": True}


def test_a_route_counts_as_served_as_routing_would_match_it() -> None:
    router = APIRouter()  # included as the app includes its route modules
    router.add_api_route("/v1/thing", lambda: {}, methods=["POST"])
    app = FastAPI()
    app.include_router(router)
    assert _serves(app.router.routes, "/v1/thing", "POST")
    assert not _serves(app.router.routes, "/v1/thing", "GET")
    assert not _serves(app.router.routes, "/v1/other", "POST")


async def test_a_tenant_sees_its_models_and_its_own_traffic_only(
    provider: ListingProvider, tmp_path: Path
) -> None:
    TIME_TO_FIRST_TOKEN.labels(model="img-b", tenant="globex").observe(0.5)
    TIME_TO_FIRST_TOKEN.labels(model="img-b", tenant="acme").observe(0.5)
    TIME_TO_FIRST_TOKEN.labels(model="chat-a", tenant="acme").observe(0.5)
    config, keys = _auth_config(tmp_path)
    async with make_client(build_app(provider, config)) as client:
        globex = (await client.get("/ui/api/summary", headers=_bearer(keys["globex"]))).json()
        admin = (await client.get("/ui/api/summary", headers=_bearer(keys["ops"]))).json()
    assert [m["id"] for m in globex["models"]] == ["img-b"]  # its allow-list
    assert set(globex["models"][0]) <= {"id", "kind", "pin", "state", "status"}
    assert globex["memory"] is None
    assert set(globex["metrics"]) <= {"img-b"}
    own = globex["metrics"]["img-b"]["ttft"]["count"]
    everyone = admin["metrics"]["img-b"]["ttft"]["count"]
    assert everyone - own >= 1  # acme's request is not in globex's figures
    assert "chat-a" in admin["metrics"]
    assert admin["memory"]["budget_bytes"] == 1000
    assert admin["models"][0]["memory_bytes"] == 123
