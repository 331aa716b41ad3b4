"""`POST /v1/load_lora_adapter` with real adapter folders (made with peft on a tiny random Llama,
the base model's source) behind the real routes, over a fake engine: every malformed adapter is
a 400 in the OpenAI envelope naming what is wrong (param `lora_path`) and registers nothing,
after which a good adapter still loads and serves; with `server.lora_root` set, a folder inside
loads, and one outside it, reached by `..` or through a symlink (of the folder or of a file in
it), is a 400. A good adapter is registered under its resolved folder."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from api_helpers import make_client

from fakes.llm import FakeLLM
from fakes.models import CatalogProvider
from lora_helpers import MALFORMED, make_adapter, malformed_adapters, tiny_llama
from modelyard.api.app import build_app
from modelyard.config import ModelyardConfig, ServerConfig
from modelyard.manager.catalog import Catalog
from modelyard.model_spec import ModelKind, ModelSpec

pytestmark = pytest.mark.unit

LOAD = "/v1/load_lora_adapter"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("lora-admin") / "base")


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory, base: Path) -> Path:
    return make_adapter(base, tmp_path_factory.mktemp("lora-admin-good") / "good", seed=1, rank=4)


class LoRAProvider(CatalogProvider):
    """Fake engines, and the catalog the routes read: one LLM on the tiny base, serving LoRA."""

    def __init__(self, base: Path) -> None:
        specs = [
            ModelSpec(
                id="base",
                kind=ModelKind.CHAT,
                backend="llm",
                source=str(base),
                options={"max_lora_rank": 8},
            )
        ]
        super().__init__(specs)
        self.catalog = Catalog(specs)


@asynccontextmanager
async def serving(base: Path, lora_root: Path | None = None) -> AsyncIterator[httpx.AsyncClient]:
    root = str(lora_root) if lora_root is not None else None
    config = ModelyardConfig(server=ServerConfig(lora_root=root))
    async with make_client(build_app(LoRAProvider(base), config)) as client:  # type: ignore[arg-type]
        yield client


async def load(client: httpx.AsyncClient, name: str, path: Path | str) -> httpx.Response:
    return await client.post(LOAD, json={"lora_name": name, "lora_path": str(path)})


async def models(client: httpx.AsyncClient) -> set[str]:
    return {m["id"] for m in (await client.get("/v1/models")).json()["data"]}


async def test_malformed_adapters_are_400s_naming_what_is_wrong(
    tmp_path: Path, base: Path, good: Path
) -> None:
    other_base = tiny_llama(tmp_path / "other-base", hidden=48)
    cases = malformed_adapters(base, good, tmp_path / "bad", other_base=other_base)
    async with serving(base) as client:
        for case in MALFORMED:
            folder, words = cases[case]
            response = await load(client, case, folder)
            assert response.status_code == 400, (case, response.text)
            error = response.json()["error"]
            assert words in error["message"], case
            assert (error["type"], error["param"]) == ("invalid_request_error", "lora_path")
        assert not await models(client) & set(MALFORMED)  # nothing half-registered
        assert (await load(client, "good", good)).status_code == 200
        completion = {"model": "good", "prompt": "abc", "max_tokens": 2}
        assert (await client.post("/v1/completions", json=completion)).status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "",
        "relative/../../nowhere",
        "/nul\x00byte",
        "/" + "x" * 5000,
    ],
)
async def test_a_lora_path_that_names_no_folder_is_a_400(base: Path, path: str) -> None:
    async with serving(base) as client:
        response = await load(client, "x", path)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "lora_path"


@pytest.fixture
def rooted(tmp_path: Path, good: Path) -> dict[str, Path]:
    """An adapter inside lora_root, one outside it, and ways out of the root."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    shutil.copytree(good, root / "inside")
    shutil.copytree(good, outside)
    (root / "linked").symlink_to(outside, target_is_directory=True)
    (root / "file-linked").mkdir()
    for file in ("adapter_config.json", "adapter_model.safetensors"):
        (root / "file-linked" / file).symlink_to(outside / file)
    (root / "inner").mkdir()
    return {"root": root, "inside": root / "inside", "outside": outside}


async def test_lora_root_accepts_folders_inside_it(base: Path, rooted: dict[str, Path]) -> None:
    root = rooted["root"]
    async with serving(base, lora_root=root) as client:
        assert (await load(client, "a", rooted["inside"])).status_code == 200
        dotted = root / "inner" / ".." / "inside"  # `..` that stays inside
        assert (await load(client, "b", dotted)).status_code == 200
        assert {"a", "b"} <= await models(client)


@pytest.mark.parametrize(
    "escape",
    [
        lambda r: r["outside"],
        lambda r: r["root"] / ".." / "outside",
        lambda r: r["root"] / "inner" / ".." / ".." / "outside",
        lambda r: r["root"] / "linked",
        lambda r: r["root"] / "file-linked",
    ],
    ids=["outside", "dot-dot", "deeper-dot-dot", "symlinked-folder", "symlinked-files"],
)
async def test_lora_root_refuses_folders_outside_it(
    base: Path, rooted: dict[str, Path], escape: Callable[[dict[str, Path]], Path]
) -> None:
    async with serving(base, lora_root=rooted["root"]) as client:
        response = await load(client, "escaped", escape(rooted))
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert "outside the server's lora_root" in error["message"]
        assert error["param"] == "lora_path"
        assert "escaped" not in await models(client)


async def test_an_adapter_is_registered_under_its_resolved_folder(
    tmp_path: Path, base: Path, good: Path
) -> None:
    (tmp_path / "link").symlink_to(good, target_is_directory=True)
    provider = LoRAProvider(base)
    async with make_client(build_app(provider, ModelyardConfig())) as client:  # type: ignore[arg-type]
        assert (await load(client, "linked", tmp_path / "link")).status_code == 200
        completion = {"model": "linked", "prompt": "abc", "max_tokens": 2}
        assert (await client.post("/v1/completions", json=completion)).status_code == 200
    llm = provider.models["base"]
    assert isinstance(llm, FakeLLM)
    lora = llm.calls[-1].lora
    assert lora is not None
    assert lora.path == str(good)  # pytest's temporary folders are resolved already
