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
