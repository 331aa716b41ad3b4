"""Request inputs -> backend items, per kind (the HTTP side of backends/base.py's item rules).

Text kinds take a string or a list of strings. Image kinds take base64 strings (optionally a
`data:image/...;base64,` URL) or raw bytes from a multipart upload, each at most
MAX_IMAGE_BYTES; anything that looks like a server-side path or URL is refused — the server
never opens a file a request names. Tensor kinds take `{name: tensor}` (KServe JSON tensors).
All problems raise ValueError (HTTP 400).
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from modelyard.backends.image import MAX_IMAGE_BYTES
from modelyard.model_spec import ModelKind

MAX_ITEMS = 256  # items per request
_PATH_LIKE = re.compile(r"^(/|\./|\.\./|~|[A-Za-z]:\\|\\\\|file:|https?:|s3:|gs:)")
TEXT_KINDS = (
    ModelKind.EMBEDDING,
    ModelKind.TEXT_CLASSIFICATION,
    ModelKind.ZERO_SHOT_CLASSIFICATION,
)


def as_list(value: Any) -> list[Any]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise ValueError("input must not be empty")
    if len(items) > MAX_ITEMS:
        raise ValueError(f"at most {MAX_ITEMS} inputs per request")
    return items


def decode_image_input(value: Any) -> bytes:
    """A base64 string (or raw bytes) -> encoded image bytes; never a path."""
    if isinstance(value, bytes | bytearray):
        data = bytes(value)
    elif isinstance(value, str):
        text = value.strip()
        if _PATH_LIKE.match(text) and not text.startswith("data:"):
            raise ValueError(
                "images must be sent as base64 or uploaded; paths and URLs are refused"
            )
        if text.startswith("data:"):
            text = text.partition(",")[2]
        if len(text) > MAX_IMAGE_BYTES * 4 // 3 + 8:
            raise ValueError(f"image larger than {MAX_IMAGE_BYTES} bytes")
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError("image is not valid base64") from exc
    else:
        raise ValueError("an image input is a base64 string")
    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(f"image larger than {MAX_IMAGE_BYTES} bytes")
    return data


def items_for_kind(kind: ModelKind, input_data: Any) -> list[Any]:
    """JSON input_data of /predict -> a list of items for a model of `kind`."""
    if kind.is_llm:
        raise ValueError("this is an LLM: use /v1/chat/completions or /v1/completions")
    if kind in TEXT_KINDS:
        items = as_list(input_data)
        if not all(isinstance(item, str) for item in items):
            raise ValueError("this model takes text: a string or a list of strings")
        return items
    if kind == ModelKind.IMAGE_CLASSIFICATION:
        return [decode_image_input(item) for item in as_list(input_data)]
    if isinstance(input_data, dict):
        input_data = [input_data]
    items = as_list(input_data)
    if not all(isinstance(item, dict) and item for item in items):
        raise ValueError("this model takes named tensors: {name: {shape, datatype, data}}")
    return items
