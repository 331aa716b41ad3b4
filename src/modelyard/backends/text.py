"""Transformers text backends: sentence embeddings, zero-shot classification over them, and
sequence classification (any `AutoModelForSequenceClassification` folder).

Embeddings: `AutoModel` -> mean of the last hidden state over real tokens -> L2 normalisation
(matches sentence-transformers for all-MiniLM-L6-v2).

Zero-shot: each label becomes a hypothesis ("This text is about {label}." by default, option
`hypothesis_template`); the score of a label is the softmax over labels of
cosine(text, hypothesis) / temperature (option `temperature`, default 0.05). Labels come from the
request's `labels` option or the catalog's `labels` option.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from modelyard.backends.base import (
    TEXT_METADATA,
    Output,
    embedding_outputs,
    ranked,
    require_text,
    top_k_option,
)
from modelyard.backends.options import (
    ClassifierOptions,
    EmbeddingOptions,
    ZeroShotOptions,
    options_of,
)
from modelyard.model_spec import ModelSpec
from modelyard.sources import resolve_source


class EmbeddingBackend:
    """Text -> L2-normalised mean-pooled embedding (list[float])."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.max_length = options_of(spec, EmbeddingOptions).max_length
        self._model: Any = None
        self._tokenizer: Any = None

    def load(self) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = resolve_source(self.spec.source)
        self._tokenizer = AutoTokenizer.from_pretrained(path)
        self._model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()

    def preprocess(self, item: Any, options: dict[str, Any]) -> Any:
        return require_text(item)

    def embed(self, texts: Sequence[str]) -> NDArray[Any]:
        """(n, dim) float32, rows of unit length."""
        return self.embed_counted(texts)[0]

    def embed_counted(self, texts: Sequence[str]) -> tuple[NDArray[Any], list[int]]:
        """(n, dim) float32 rows of unit length, and the tokens the model read for each text."""
        import torch

        batch = self._tokenizer(
            list(texts),
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        with torch.inference_mode():
            hidden = self._model(**batch).last_hidden_state  # (B, T, H)
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (B, H)
        normed = torch.nn.functional.normalize(pooled, p=2, dim=1)
        result: NDArray[Any] = normed.float().numpy()
        return result, batch["attention_mask"].sum(1).tolist()

    def infer(self, items: Sequence[Any], options: dict[str, Any]) -> list[Output]:
        vectors, tokens = self.embed_counted(items)
        return embedding_outputs(vectors.tolist(), tokens, options)

    def metadata(self) -> dict[str, Any]:
        dim = int(self._model.config.hidden_size) if self._model is not None else -1
        return {
            **TEXT_METADATA,
            "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, dim]}],
        }

    def close(self) -> None:
        self._model = None


def _labels_from(options: dict[str, Any], spec: ModelSpec) -> list[str]:
    labels = options.get("labels", list(options_of(spec, ZeroShotOptions).labels))
    if isinstance(labels, str):
        labels = [part.strip() for part in labels.split(",") if part.strip()]
    if not isinstance(labels, list) or not labels or len(labels) > 100:
        raise ValueError("zero-shot classification needs 1 to 100 candidate labels ('labels')")
    if not all(isinstance(label, str) and label for label in labels):
        raise ValueError("labels must be non-empty strings")
    return labels


class ZeroShotBackend(EmbeddingBackend):
    """Text -> ranked labels, by similarity of the text to one hypothesis per label."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        options = options_of(spec, ZeroShotOptions)
        self.template = options.hypothesis_template
        self.temperature = options.temperature
        self._hypotheses: dict[tuple[str, ...], NDArray[Any]] = {}

    def preprocess(self, item: Any, options: dict[str, Any]) -> Any:
        _labels_from(options, self.spec)
        top_k_option(options)
        return require_text(item)

    def infer(self, items: Sequence[Any], options: dict[str, Any]) -> list[Output]:
        labels = _labels_from(options, self.spec)
        key = tuple(labels)
        if key not in self._hypotheses:
            self._hypotheses[key] = self.embed([self.template.format(label) for label in labels])
        cosine = self.embed(items) @ self._hypotheses[key].T  # (n, num_labels)
        logits = cosine / self.temperature
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        top_k = top_k_option(options, default=len(labels))
        return [ranked(row.tolist(), labels, top_k) for row in probs]

    def metadata(self) -> dict[str, Any]:
        return {**TEXT_METADATA, "outputs": [{"name": "label", "datatype": "BYTES", "shape": [-1]}]}


class SequenceClassifierBackend:
    """Text -> ranked labels from an AutoModelForSequenceClassification (labels: id2label)."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.max_length = options_of(spec, ClassifierOptions).max_length
        self._model: Any = None
        self._tokenizer: Any = None
        self._labels: list[str] = []

    def load(self) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = resolve_source(self.spec.source)
        self._tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
        self._model = model.eval()
        id2label = model.config.id2label
        self._labels = [str(id2label[i]) for i in range(model.config.num_labels)]

    def preprocess(self, item: Any, options: dict[str, Any]) -> Any:
        top_k_option(options)
        return require_text(item)

    def infer(self, items: Sequence[Any], options: dict[str, Any]) -> list[Output]:
        import torch

        batch = self._tokenizer(
            list(items),
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        with torch.inference_mode():
            probs = self._model(**batch).logits.float().softmax(-1).numpy()  # (B, num_labels)
        top_k = top_k_option(options, default=len(self._labels))
        return [ranked(row.tolist(), self._labels, top_k) for row in probs]

    def metadata(self) -> dict[str, Any]:
        return {**TEXT_METADATA, "outputs": [{"name": "label", "datatype": "BYTES", "shape": [-1]}]}

    def close(self) -> None:
        self._model = None
