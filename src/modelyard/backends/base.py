"""What a worker process runs: the `Backend` protocol, and the fixed request/response shape per
kind.

Items (one request carries a list of them; the batcher joins items of several requests):
- text kinds (embedding, text/zero-shot classification): `str`;
- image-classification: `bytes` (an encoded image file; decoded in the worker, size-limited);
- tensor: `dict[name, Tensor]` where a Tensor is `{"shape": [...], "datatype": "FP32",
  "data": [flat values]}` (KServe v2 JSON tensors).

Outputs (one per item):
- classification kinds: a ranked list of `{"label": str, "score": float}` (`top_k` option);
- embedding: `list[float]`; with the option `usage: true` (what /v1/embeddings asks for),
  `{"embedding": list[float], "tokens": int}`, tokens counting what the model read (special
  tokens included, after truncation);
- tensor: `dict[name, Tensor]`.

Bad input raises `ValueError` (-> HTTP 400); anything else is a server error.
Lifecycle, all inside the worker: `load()` once, then `preprocess(item, options)` per item as it
arrives (so one bad item fails only its own request), `infer(prepared, options)` per batch, and
`close()` exactly once at unload (explicit, never from `__del__`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

Output = Any  # one item's output, shaped per kind (see above)


class Backend(Protocol):
    def load(self) -> None:
        """Load weights (blocking; runs in the worker before it reports ready)."""
        ...

    def preprocess(self, item: Any, options: dict[str, Any]) -> Any:
        """Validate and prepare one item; ValueError when it is wrong for the model."""
        ...

    def infer(self, items: Sequence[Any], options: dict[str, Any]) -> list[Output]:
        """One backend call for a batch of prepared items; one output per item, in order."""
        ...

    def metadata(self) -> dict[str, Any]:
        """KServe-style `{"inputs": [...], "outputs": [...]}` tensor metadata."""
        ...

    def close(self) -> None:
        """Release what load() acquired (e.g. unload the model in a remote Triton)."""
        ...


def ranked(scores: Sequence[float], labels: Sequence[str], top_k: int) -> list[dict[str, Any]]:
    """Scores of one item -> the top_k `{label, score}` pairs, highest first."""
    order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)[: max(1, top_k)]
    return [{"label": labels[i], "score": float(scores[i])} for i in order]


def top_k_option(options: dict[str, Any], default: int = 5) -> int:
    value = options.get("top_k", default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError("top_k must be a positive integer")
    return value


def require_text(item: Any, max_chars: int = 100_000) -> str:
    if not isinstance(item, str):
        raise ValueError("this model takes text inputs (a string or a list of strings)")
    if len(item) > max_chars:
        raise ValueError(f"text longer than {max_chars} characters")
    return item


TEXT_METADATA: dict[str, Any] = {
    "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
}


def embedding_outputs(
    vectors: list[list[float]], tokens: Sequence[int], options: dict[str, Any]
) -> list[Output]:
    """Embedding outputs (vectors as Python float lists, e.g. from `.tolist()`) in the shape
    the options ask for (see the module docstring)."""
    if options.get("usage") is True:
        return [{"embedding": v, "tokens": int(n)} for v, n in zip(vectors, tokens, strict=True)]
    return list(vectors)
