"""KServe v2 / Open Inference Protocol JSON tensors <-> numpy.

A tensor is `{"shape": [...], "datatype": "FP32", "data": [values, flat or nested]}`; BYTES
tensors hold strings. ValueError for a bad tensor (-> HTTP 400).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from numpy.typing import NDArray

DATATYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}
MAX_TENSOR_ELEMENTS = 50_000_000


def datatype_of(array: NDArray[Any]) -> str:
    if array.dtype.kind in ("U", "S", "O"):
        return "BYTES"
    for name, dtype in DATATYPES.items():
        if dtype is not np.object_ and array.dtype == np.dtype(dtype):
            return name
    raise ValueError(f"no KServe datatype for numpy dtype {array.dtype}")


def to_numpy(tensor: Any) -> NDArray[Any]:
    """A JSON tensor -> numpy array of its shape and datatype."""
    if not isinstance(tensor, dict):
        raise ValueError("a tensor is an object with shape, datatype and data")
    datatype, shape, data = tensor.get("datatype"), tensor.get("shape"), tensor.get("data")
    if datatype not in DATATYPES:
        raise ValueError(f"unknown datatype {datatype!r}")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ValueError("shape must be a list of non-negative integers")
    if math.prod(shape) > MAX_TENSOR_ELEMENTS:
        raise ValueError(f"tensor too large: at most {MAX_TENSOR_ELEMENTS} elements")
    try:
        with warnings.catch_warnings():  # an integer out of its datatype's range must not wrap
            warnings.simplefilter("error", DeprecationWarning)
            array = np.asarray(data, dtype=DATATYPES[datatype])
        return array.reshape(shape)
    except (TypeError, ValueError, OverflowError, DeprecationWarning) as exc:
        raise ValueError(f"data does not match shape {shape} / {datatype}: {exc}") from exc


def from_numpy(array: NDArray[Any]) -> dict[str, Any]:
    """numpy array -> a JSON tensor (flat data)."""
    datatype = datatype_of(array)
    if datatype == "BYTES":
        data: list[Any] = [
            v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            for v in array.reshape(-1).tolist()
        ]
    else:
        data = array.reshape(-1).tolist()
    return {"shape": list(array.shape), "datatype": datatype, "data": data}


#: numpy dtype names (the textbook's `dtype`) -> KServe datatypes.
_DTYPE_NAMES = {np.dtype(t).name: name for name, t in DATATYPES.items() if t is not np.object_}


def named_tensors(item: Any, inputs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A named-tensor input checked against the model's input metadata: KServe JSON tensors
    (`{name: {"shape", "datatype", "data"}}`) or the textbook's (`"dtype": "float32"` instead of
    `datatype`; the datatype may be left out). A shape may leave out a leading batch dimension
    the model declares as -1 (one item then). ValueError naming the input on any mismatch."""
    if not isinstance(item, dict) or not item:
        raise ValueError("this model takes named tensors: {name: {shape, data, datatype}}")
    expected = {str(i.get("name")): i for i in inputs}
    if expected and set(item) != set(expected):
        raise ValueError(f"inputs must be exactly {sorted(expected)}, got {sorted(item)}")
    checked = {}
    for name, tensor in item.items():
        if not isinstance(tensor, dict):
            raise ValueError(f"{name}: a tensor is an object with shape and data")
        meta = expected.get(name, {})
        datatype = _datatype(name, tensor, meta.get("datatype"))
        shape = _fit_shape(name, tensor.get("shape"), meta.get("shape"))
        checked[name] = {"shape": shape, "datatype": datatype, "data": tensor.get("data")}
        try:
            to_numpy(checked[name])
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from exc
    return checked


def _datatype(name: str, tensor: dict[str, Any], model_type: Any) -> str:
    given = tensor.get("datatype")
    dtype = tensor.get("dtype")
    if given is None and dtype is not None:
        given = _DTYPE_NAMES.get(str(dtype))
        if given is None:
            raise ValueError(f"{name}: unknown dtype {dtype!r}")
    if given is None:
        given = model_type
    if model_type is not None and given != model_type:
        raise ValueError(f"{name}: the model takes {model_type}, got {given}")
    if given not in DATATYPES:
        raise ValueError(f"{name}: unknown datatype {given!r}")
    return str(given)


def _fit_shape(name: str, shape: Any, model_shape: Any) -> list[int]:
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"{name}: shape must be a list of non-negative integers")
    if not isinstance(model_shape, list):
        return shape
    fitted = shape
    if len(shape) == len(model_shape) - 1 and model_shape and model_shape[0] == -1:
        fitted = [1, *shape]  # the batch dimension left out
    fits = len(fitted) == len(model_shape) and all(
        m == -1 or m == d for d, m in zip(fitted, model_shape, strict=True)
    )
    if not fits:
        raise ValueError(f"{name}: shape {shape} does not match the model's {model_shape}")
    return fitted
