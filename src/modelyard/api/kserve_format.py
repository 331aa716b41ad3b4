"""KServe v2 / Open Inference Protocol bodies <-> backend items and outputs, per kind.

- tensor kinds: all request inputs form one item `{name: tensor}`; the outputs are the item's
  named tensors (filtered by the request's `outputs` when given);
- text kinds: the first input (BYTES, UTF-8 strings) holds the texts; images: the first input
  (BYTES) holds base64 strings (JSON) or raw encoded images (binary extension);
- outputs: embeddings -> `embedding` FP32 [n, dim]; classification -> `label` BYTES [n, k]
  and `score` FP32 [n, k] (k = `top_k` request parameter).

The Triton binary tensor extension is read on input (`Inference-Header-Content-Length`: a JSON
header then raw tensors, each input's `parameters.binary_data_size` bytes; BYTES elements are
4-byte little-endian length-prefixed), so `tritonclient.http` works with its default
`binary_data=True`. Responses are always JSON.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from modelyard.api.inputs import TEXT_KINDS, decode_image_input
from modelyard.backends.tensors import DATATYPES
from modelyard.model_spec import ModelKind


def parse_infer_body(body: bytes, header_length: str | None) -> dict[str, Any]:
    """The JSON request (binary tensors moved into each input's `data`); ValueError if bad."""
    if header_length is None:
        try:
            request = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError("request body is not valid JSON") from exc
        _check_request(request)
        return dict(request)
    try:
        size = int(header_length)
        request = json.loads(body[:size])
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError("bad Inference-Header-Content-Length or JSON header") from exc
    _check_request(request)
    offset = size
    for tensor in request["inputs"]:
        length = (tensor.get("parameters") or {}).get("binary_data_size")
        if length is None:
            continue
        raw = body[offset : offset + int(length)]
        if len(raw) != int(length):
            raise ValueError("binary tensor data is shorter than announced")
        offset += int(length)
        tensor["data"] = _from_binary(raw, tensor.get("datatype"))
    return dict(request)


def _check_request(request: Any) -> None:
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise ValueError("an inference request is an object with an 'inputs' list")
    for tensor in request["inputs"]:
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise ValueError("each input needs a name, shape, datatype and data")


def _from_binary(raw: bytes, datatype: Any) -> list[Any]:
    if datatype == "BYTES":
        values: list[Any] = []
        offset = 0
        while offset < len(raw):
            (length,) = struct.unpack_from("<I", raw, offset)
            values.append(raw[offset + 4 : offset + 4 + length])
            offset += 4 + length
        return values
    if datatype not in DATATYPES:
        raise ValueError(f"unknown datatype {datatype!r}")
    return list(np.frombuffer(raw, dtype=np.dtype(DATATYPES[datatype]).newbyteorder("<")).tolist())


def items_from_request(kind: ModelKind, request: dict[str, Any]) -> list[Any]:
    inputs = request["inputs"]
    if kind == ModelKind.TENSOR:
        item = {
            t["name"]: {
                "shape": t.get("shape"),
                "datatype": t.get("datatype"),
                "data": t.get("data"),
            }
            for t in inputs
        }
        return [item]
    data = np.asarray(inputs[0].get("data"), dtype=object).reshape(-1).tolist() if inputs else []
    if not data:
        raise ValueError("the first input holds no data")
    if kind in TEXT_KINDS:
        return [v.decode("utf-8") if isinstance(v, bytes) else _text(v) for v in data]
    if kind == ModelKind.IMAGE_CLASSIFICATION:
        return [decode_image_input(v) for v in data]
    raise ValueError(f"{kind} models are not served over /v2 infer")


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("text inputs are BYTES tensors of strings")
    return value


def outputs_to_tensors(
    kind: ModelKind, outputs: list[Any], wanted: list[str] | None
) -> list[dict[str, Any]]:
    """Backend outputs -> v2 output tensors `{name, shape, datatype, data}`."""
    tensors: list[dict[str, Any]]
    if kind == ModelKind.TENSOR:
        tensors = [{"name": name, **tensor} for name, tensor in outputs[0].items()]
    elif kind == ModelKind.EMBEDDING:
        dim = len(outputs[0]) if outputs else 0
        flat = [x for vector in outputs for x in vector]
        tensors = [
            {"name": "embedding", "shape": [len(outputs), dim], "datatype": "FP32", "data": flat}
        ]
    else:
        k = min(len(row) for row in outputs) if outputs else 0
        labels = [pair["label"] for row in outputs for pair in row[:k]]
        scores = [pair["score"] for row in outputs for pair in row[:k]]
        shape = [len(outputs), k]
        tensors = [
            {"name": "label", "shape": shape, "datatype": "BYTES", "data": labels},
            {"name": "score", "shape": shape, "datatype": "FP32", "data": scores},
        ]
    if wanted:
        tensors = [t for t in tensors if t["name"] in wanted]
    return tensors


def default_metadata(kind: ModelKind) -> dict[str, Any]:
    """Tensor metadata of a kind before its model is loaded (tensor kinds need the model)."""
    inputs = [
        {
            "name": "image" if kind == ModelKind.IMAGE_CLASSIFICATION else "text",
            "datatype": "BYTES",
            "shape": [-1],
        }
    ]
    if kind == ModelKind.EMBEDDING:
        outputs = [{"name": "embedding", "datatype": "FP32", "shape": [-1, -1]}]
    else:
        outputs = [
            {"name": "label", "datatype": "BYTES", "shape": [-1, -1]},
            {"name": "score", "datatype": "FP32", "shape": [-1, -1]},
        ]
    return {"inputs": inputs, "outputs": outputs}
