"""The backends seen from outside (no worker process): one function picks a model's backend,
tensors round-trip and are checked against their datatype, an ONNX model's inputs are checked
at preprocess."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelyard.backends import create_backend
from modelyard.backends.tensors import from_numpy, to_numpy
from modelyard.model_spec import ModelKind, ModelSpec

pytestmark = pytest.mark.unit


def test_tensors_round_trip_and_validate() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(to_numpy(from_numpy(array)), array)
    with pytest.raises(ValueError, match="does not match"):
        to_numpy({"shape": [4], "datatype": "FP32", "data": [1, 2]})
    with pytest.raises(ValueError, match="datatype"):
        to_numpy({"shape": [1], "datatype": "FP99", "data": [1]})


def test_backend_choice_is_one_function() -> None:
    spec = ModelSpec(id="e", kind=ModelKind.EMBEDDING, backend="echo")
    backend = create_backend(spec)
    backend.load()
    assert backend.infer([backend.preprocess("a b", {})], {}) == [[3.0, 2.0]]
    with pytest.raises(ValueError, match="unknown backend"):
        create_backend(ModelSpec(id="x", backend="nope"))


def test_tensor_values_outside_their_datatype_are_bad_input() -> None:
    with pytest.raises(ValueError, match="does not match"):
        to_numpy({"shape": [1], "datatype": "INT8", "data": [1000]})
    with pytest.raises(ValueError, match="too large"):
        to_numpy({"shape": [2**40, 2**40], "datatype": "FP32", "data": []})


def test_onnx_tensors_must_fit_the_models_inputs(tmp_path: Path) -> None:
    """A tensor of the wrong datatype or rank is bad input at preprocess, before it can make
    the session call of its whole batch fail."""
    from onnx import TensorProto, helper, save

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, tmp_path / "relu.onnx")
    backend = create_backend(
        ModelSpec(id="t", kind=ModelKind.TENSOR, backend="onnx", source=str(tmp_path / "relu.onnx"))
    )
    backend.load()
    good = {"x": {"shape": [2], "datatype": "FP32", "data": [-1.0, 2.0]}}
    assert backend.infer([backend.preprocess(good, {})], {})[0]["y"]["data"] == [0.0, 2.0]
    with pytest.raises(ValueError, match="must be FP32"):
        backend.preprocess({"x": {**good["x"], "datatype": "FP64"}}, {})
    with pytest.raises(ValueError, match="shape"):
        backend.preprocess({"x": {"shape": [1, 2], "datatype": "FP32", "data": [1, 2]}}, {})
