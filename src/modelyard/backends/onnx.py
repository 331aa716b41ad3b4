"""ONNX Runtime backend: generic named tensors, plus two presets (option `preset`):

- `image-classification`: images in, ranked ImageNet labels out (EfficientNet preprocessing).
  Source `efficientnet-lite0` exports the packaged PyTorch model once with
  `torch.onnx.export(..., dynamo=False, opset_version=17)` and caches it under
  ~/.cache/modelyard; any other source is an .onnx file taking (B, 3, 224, 224).
- `text-embedding`: text in, mean-pooled L2-normalised embeddings out (tokenizer from option
  `tokenizer`, a folder or `package:` source), e.g. an int8 export of all-MiniLM-L6-v2.

Generic tensors (no preset): each item is `{input name: tensor}`; each output is
`{output name: tensor}`. Items run one session call each (their shapes may differ).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from modelyard.backends.base import (
    TEXT_METADATA,
    Output,
    embedding_outputs,
    ranked,
    require_text,
    top_k_option,
)
from modelyard.backends.image import IMAGE_METADATA, decode_image, imagenet_labels
from modelyard.backends.options import OnnxOptions, options_of
from modelyard.backends.tensors import from_numpy, to_numpy
from modelyard.model_spec import ModelSpec
from modelyard.sources import cache_dir, resolve_source

_ORT_TYPES = {
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(float16)": "FP16",
    "tensor(int64)": "INT64",
    "tensor(int32)": "INT32",
    "tensor(int8)": "INT8",
    "tensor(uint8)": "UINT8",
    "tensor(bool)": "BOOL",
    "tensor(string)": "BYTES",
}


def export_efficientnet_lite0(target: Path) -> Path:
    """Export the packaged EfficientNet-Lite0 to ONNX once (atomic rename into the cache)."""
    if target.exists():
        return target
    import torch

    from modelyard.backends.image import efficientnet_lite0

    model = efficientnet_lite0()
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=target.parent)
    os.close(fd)
    torch.onnx.export(
        model,
        (torch.zeros(1, 3, 224, 224),),
        tmp,
        dynamo=False,
        opset_version=17,
        input_names=["image"],
        output_names=["logits"],
        dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
    )
    os.replace(tmp, target)
    return target


def _check_fits(name: str, array: Any, datatype: Any, declared: Any) -> None:
    """ValueError unless the tensor has the datatype and shape the model's input declares (a
    mismatch would make the session call of its whole batch fail)."""
    wanted = _ORT_TYPES.get(declared.type)
    if wanted is not None and datatype != wanted:
        raise ValueError(f"input {name!r} must be {wanted}, got {datatype}")
    dims = _shape(declared.shape)
    fits = len(dims) == array.ndim and all(
        d in (-1, n) for d, n in zip(dims, array.shape, strict=True)
    )
    if not fits:
        raise ValueError(f"input {name!r} must have shape {dims} (-1: any), got {array.shape}")


def _shape(dims: Sequence[Any]) -> list[int]:
    return [d if isinstance(d, int) else -1 for d in dims]


class OnnxBackend:
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.options = options_of(spec, OnnxOptions)
        self.preset = self.options.preset
        self._session: Any = None
        self._labels: list[str] = []
        self._tokenizer: Any = None

    def model_path(self) -> Path:
        if self.spec.source == "efficientnet-lite0":
            folder = cache_dir(self.options.cache_dir)
            return export_efficientnet_lite0(folder / "efficientnet-lite0-opset17.onnx")
        return resolve_source(self.spec.source)

    def load(self) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        if self.options.intra_op_num_threads is not None:
            options.intra_op_num_threads = self.options.intra_op_num_threads
        self._session = ort.InferenceSession(
            str(self.model_path()), options, providers=["CPUExecutionProvider"]
        )
        if self.preset == "image-classification":
            self._labels = imagenet_labels()
        elif self.preset == "text-embedding":
            from transformers import AutoTokenizer

            tokenizer = resolve_source(self.options.tokenizer)
            self._tokenizer = AutoTokenizer.from_pretrained(tokenizer)

    def preprocess(self, item: Any, options: dict[str, Any]) -> Any:
        if self.preset == "image-classification":
            top_k_option(options)
            return decode_image(item)
        if self.preset == "text-embedding":
            return require_text(item)
        if not isinstance(item, dict) or not item:
            raise ValueError("this model takes named tensors")
        inputs = {i.name: i for i in self._session.get_inputs()}
        if set(item) != set(inputs):
            raise ValueError(f"inputs must be exactly {sorted(inputs)}, got {sorted(item)}")
        arrays = {name: to_numpy(tensor) for name, tensor in item.items()}
        for name, array in arrays.items():
            _check_fits(name, array, item[name].get("datatype"), inputs[name])
        return arrays

    def infer(self, items: Sequence[Any], options: dict[str, Any]) -> list[Output]:
        if self.preset == "image-classification":
            feed = {self._session.get_inputs()[0].name: np.stack(items)}
            logits = self._session.run(None, feed)[0]  # (B, 1000)
            probs = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs /= probs.sum(axis=1, keepdims=True)
            top_k = top_k_option(options)
            return [ranked(row.tolist(), self._labels, top_k) for row in probs]
        if self.preset == "text-embedding":
            return self._embed(items, options)
        names = [o.name for o in self._session.get_outputs()]
        results: list[Output] = []
        for feed in items:
            arrays = self._session.run(None, feed)
            results.append(
                {n: from_numpy(np.asarray(a)) for n, a in zip(names, arrays, strict=True)}
            )
        return results

    def _embed(self, texts: Sequence[str], options: dict[str, Any]) -> list[Output]:
        batch = self._tokenizer(
            list(texts), padding=True, truncation=True, max_length=256, return_tensors="np"
        )
        wanted = {i.name for i in self._session.get_inputs()}
        feed = {k: v.astype(np.int64) for k, v in batch.items() if k in wanted}
        hidden = self._session.run(None, feed)[0]  # (B, T, H)
        mask = batch["attention_mask"][..., None].astype(np.float32)  # (B, T, 1)
        pooled = (hidden * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)  # (B, H)
        pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        tokens = batch["attention_mask"].sum(1).tolist()
        return embedding_outputs(pooled.astype(np.float32).tolist(), tokens, options)

    def metadata(self) -> dict[str, Any]:
        if self.preset == "image-classification":
            return IMAGE_METADATA
        if self.preset == "text-embedding":
            return {
                **TEXT_METADATA,
                "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, -1]}],
            }

        def describe(args: Any) -> list[dict[str, Any]]:
            return [
                {
                    "name": a.name,
                    "datatype": _ORT_TYPES.get(a.type, a.type),
                    "shape": _shape(a.shape),
                }
                for a in args
            ]

        return {
            "inputs": describe(self._session.get_inputs()),
            "outputs": describe(self._session.get_outputs()),
        }

    def close(self) -> None:
        self._session = None
