from __future__ import annotations

import base64

import numpy as np
import pytest

from modelyard.api.inputs import decode_image_input, items_for_kind
from modelyard.api.kserve_format import outputs_to_tensors, parse_infer_body
from modelyard.backends.base import ranked
from modelyard.model_spec import ModelKind

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
