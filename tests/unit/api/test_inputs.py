from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest

from modelyard.api.inputs import decode_image_input, items_for_kind
from modelyard.api.kserve_format import outputs_to_tensors, parse_infer_body
from modelyard.backends import create_backend
from modelyard.backends.base import ranked
from modelyard.backends.tensors import from_numpy, to_numpy
from modelyard.model_spec import ModelKind, ModelSpec

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "value",
    [
        "/etc/passwd",
        "./a.png",
        "../x",
        "~/img.jpg",
        "file:///etc/hosts",
        "https://example.com/a.png",
        "C:\\img.png",
    ],
)
def test_path_like_image_inputs_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match="paths and URLs"):
        decode_image_input(value)


def test_base64_and_data_url_images_decode() -> None:
    payload = base64.b64encode(b"\x89PNG...").decode()
    assert decode_image_input(payload) == b"\x89PNG..."
    assert decode_image_input(f"data:image/png;base64,{payload}") == b"\x89PNG..."
    with pytest.raises(ValueError, match="base64"):
        decode_image_input("%%%")


def test_items_per_kind() -> None:
    assert items_for_kind(ModelKind.EMBEDDING, "hi") == ["hi"]
    with pytest.raises(ValueError):
        items_for_kind(ModelKind.EMBEDDING, [1, 2])
    with pytest.raises(ValueError, match="LLM"):
        items_for_kind(ModelKind.CHAT, "hi")
    with pytest.raises(ValueError, match="named tensors"):
        items_for_kind(ModelKind.TENSOR, "hi")
    with pytest.raises(ValueError, match="at most"):
        items_for_kind(ModelKind.EMBEDDING, ["x"] * 1000)


def test_tensors_round_trip_and_validate() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(to_numpy(from_numpy(array)), array)
    with pytest.raises(ValueError, match="does not match"):
        to_numpy({"shape": [4], "datatype": "FP32", "data": [1, 2]})
    with pytest.raises(ValueError, match="datatype"):
        to_numpy({"shape": [1], "datatype": "FP99", "data": [1]})


def test_binary_tensor_extension_is_parsed() -> None:
    values = np.array([1.5, -2.0], dtype="<f4").tobytes()
    strings = b"".join(len(s).to_bytes(4, "little") + s for s in (b"ab", b"xyz"))
    header = (
        b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", '
        b'"parameters": {"binary_data_size": 8}}, {"name": "s", "shape": [2], '
        b'"datatype": "BYTES", "parameters": {"binary_data_size": 13}}]}'
    )
    body = parse_infer_body(header + values + strings, str(len(header)))
    assert body["inputs"][0]["data"] == [1.5, -2.0]
    assert body["inputs"][1]["data"] == [b"ab", b"xyz"]
    with pytest.raises(ValueError, match="shorter"):
        parse_infer_body(header + values, str(len(header)))


def test_classification_outputs_become_label_and_score_tensors() -> None:
    rows = [
        ranked([0.1, 0.7, 0.2], ["a", "b", "c"], 2),
        ranked([0.5, 0.4, 0.1], ["a", "b", "c"], 2),
    ]
    label, score = outputs_to_tensors(ModelKind.ZERO_SHOT_CLASSIFICATION, rows, None)
    assert label["data"] == ["b", "c", "a", "b"]
    assert label["shape"] == [2, 2]
    assert score["data"] == pytest.approx([0.7, 0.2, 0.5, 0.4])


def test_backend_choice_is_one_function() -> None:
    spec = ModelSpec(id="e", kind=ModelKind.EMBEDDING, backend="echo")
    backend = create_backend(spec)
    backend.load()
    assert backend.infer([backend.preprocess("a b", {})], {}) == [[3.0, 2.0]]
    with pytest.raises(ValueError, match="unknown backend"):
        create_backend(ModelSpec(id="x", backend="nope"))


def _binary_body(header: bytes, payload: bytes) -> tuple[bytes, str]:
    return header + payload, str(len(header))


@pytest.mark.parametrize(
    ("body", "header_length", "message"),
    [
        (
            b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], '
            b'"parameters": [1]}',
            None,
            "parameters must be an object",
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1], '
            b'"parameters": "p"}]}',
            None,
            r"inputs\[0\].parameters must be an object",
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]}',
            None,
            "shape",
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [true], "datatype": "FP32", "data": [1]}]}',
            None,
            "shape",
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [1], "datatype": 7, "data": [1]}]}',
            None,
            "datatype",
        ),
        (b'{"inputs": [{"name": 3, "shape": [1], "datatype": "FP32", "data": [1]}]}', None, "name"),
        (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}', None, "no data"),
        (b'{"inputs": {}}', None, "inputs must be a list"),
        (
            b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], '
            b'"outputs": [{"name": 1}]}',
            None,
            r"outputs\[0\]",
        ),
        (b'{"id": 5, "inputs": []}', None, "id must be a string"),
        (b"[1, 2]", None, "JSON object"),
        (b"\xff\xfe", None, "not valid JSON"),
        *[
            (
                *_binary_body(
                    b'{"inputs": [{"name": "s", "shape": [1], "datatype": "BYTES", '
                    b'"parameters": {"binary_data_size": 3}}]}',
                    b"\x05\x00\x00",
                ),
                "length prefix is truncated",
            ),
            (
                *_binary_body(
                    b'{"inputs": [{"name": "s", "shape": [1], "datatype": "BYTES", '
                    b'"parameters": {"binary_data_size": 6}}]}',
                    b"\x09\x00\x00\x00ab",
                ),
                "longer than",
            ),
            (
                *_binary_body(
                    b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", '
                    b'"parameters": {"binary_data_size": 3}}]}',
                    b"\x00\x00\x80",
                ),
                "whole number",
            ),
            (
                *_binary_body(
                    b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", '
                    b'"parameters": {"binary_data_size": -4}}]}',
                    b"",
                ),
                "binary_data_size",
            ),
        ],
        (b'{"inputs": []}', "9999", "Inference-Header-Content-Length"),
        (b'{"inputs": []}', "-1", "Inference-Header-Content-Length"),
    ],
)
def test_every_kserve_field_is_type_checked(
    body: bytes, header_length: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        parse_infer_body(body, header_length)


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
