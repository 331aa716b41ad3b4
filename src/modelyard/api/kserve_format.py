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
    """The JSON request (binary tensors moved into each input's `data`), every field's type
    checked; ValueError naming the first bad field."""
    size = len(body)
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise ValueError(
                "Inference-Header-Content-Length must be the size of the JSON header in bytes"
            )
        size = int(header_length)
    try:
        request = json.loads(body[:size])
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError("the inference request is not valid JSON") from exc
    check_infer_request(request)
    if header_length is not None:
        offset = size
        for tensor in request["inputs"]:
            length = (tensor.get("parameters") or {}).get("binary_data_size")
            if length is None:
                continue
            raw = body[offset : offset + length]
            if len(raw) != length:
                raise ValueError(
                    f"binary data of input {tensor['name']!r} is shorter than announced"
                )
            offset += length
            tensor["data"] = _from_binary(raw, tensor["datatype"])
    return dict(request)


def check_infer_request(request: Any) -> None:
    """The types of every field of a KServe v2 inference request; ValueError if one is wrong."""
    if not isinstance(request, dict):
        raise ValueError("an inference request is a JSON object")
    if "id" in request and not isinstance(request["id"], str):
        raise ValueError("id must be a string")
    _check_parameters(request.get("parameters"), "parameters")
    inputs = request.get("inputs")
    if not isinstance(inputs, list):
        raise ValueError("inputs must be a list of tensors")
    for index, tensor in enumerate(inputs):
        _check_input(tensor, f"inputs[{index}]")
    outputs = request.get("outputs", [])
    if not isinstance(outputs, list):
        raise ValueError("outputs must be a list")
    for index, output in enumerate(outputs):
        where = f"outputs[{index}]"
        if not isinstance(output, dict) or not isinstance(output.get("name"), str):
            raise ValueError(f"{where} must be an object with a string name")
        _check_parameters(output.get("parameters"), f"{where}.parameters")


def _check_input(tensor: Any, where: str) -> None:
    if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
        raise ValueError(f"{where} must be an object with a string name")
    if tensor.get("datatype") not in DATATYPES:
        raise ValueError(f"{where}.datatype must be one of {sorted(DATATYPES)}")
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise ValueError(f"{where}.shape must be a list of non-negative integers")
    _check_parameters(tensor.get("parameters"), f"{where}.parameters")
    size = (tensor.get("parameters") or {}).get("binary_data_size")
    if size is not None and not _is_count(size):
        raise ValueError(f"{where}.parameters.binary_data_size must be a non-negative integer")
    if size is None and "data" not in tensor:
        raise ValueError(f"{where} has no data")


def _check_parameters(parameters: Any, where: str) -> None:
    if parameters is not None and not isinstance(parameters, dict):
        raise ValueError(f"{where} must be an object")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _from_binary(raw: bytes, datatype: str) -> list[Any]:
    if datatype == "BYTES":
        values: list[Any] = []
        offset = 0
        while offset < len(raw):
            if offset + 4 > len(raw):
                raise ValueError("a BYTES element's 4-byte length prefix is truncated")
            (length,) = struct.unpack_from("<I", raw, offset)
            if offset + 4 + length > len(raw):
                raise ValueError("a BYTES element is longer than the binary data left")
            values.append(raw[offset + 4 : offset + 4 + length])
            offset += 4 + length
        return values
    dtype = np.dtype(DATATYPES[datatype]).newbyteorder("<")
    if len(raw) % dtype.itemsize:
        raise ValueError(f"binary {datatype} data is not a whole number of elements")
    return list(np.frombuffer(raw, dtype=dtype).tolist())


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
