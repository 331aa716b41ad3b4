"""A predictor entry's catalog `options`, typed per backend.

`BACKEND_OPTIONS` maps a catalog `backend` name to the frozen dataclass its `options` parse into
(config_parse.from_mapping: limits on the fields, unknown keys refused with a dotted path). A
backend without options takes `NoOptions`, so any key it is given is an error. A backend
registered at run time (`backends.register_backend`) names its options class the same way.
A leaf module: the catalog (API process) and the backends (worker processes) both read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from modelyard.cache_dir import cache_dir_from_environment
from modelyard.config_parse import ConfigError, check_fields, setting

T = TypeVar("T")
OnnxPreset = Literal["", "image-classification", "text-embedding"]


@dataclass(frozen=True, kw_only=True)
class NoOptions:
    """A backend that takes no catalog options."""


@dataclass(frozen=True, kw_only=True)
class OnnxOptions:
    """`backend: onnx` (backends/onnx.py)."""

    preset: OnnxPreset = ""  # pre/post-processing around the session ("": raw tensors)
    intra_op_num_threads: int | None = setting(None, ge=1)  # None: ONNX Runtime's default
    tokenizer: str = ""  # preset text-embedding: the tokenizer's source (a HF folder)
    # where the packaged model's export goes: MODELYARD_CACHE_DIR (read when the catalog is
    # built, modelyard.cache_dir), else ~/.cache/modelyard
    cache_dir: str = setting(factory=cache_dir_from_environment)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.preset == "text-embedding" and not self.tokenizer:
            raise ConfigError("tokenizer", "is needed by the preset 'text-embedding'")


@dataclass(frozen=True, kw_only=True)
class ImageOptions:
    """`backend: torchvision` / `efficientnet` (backends/image.py)."""

    weights: str = ""  # torchvision: a local .pth state dict ("": random weights)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class EmbeddingOptions:
    """`backend: embeddings` (backends/text.py)."""

    max_length: int = setting(256, ge=1)  # tokens kept per text

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class ZeroShotOptions(EmbeddingOptions):
    """`backend: zero-shot` (backends/text.py): the embedding options and these."""

    labels: tuple[str, ...] = ()  # default candidate labels (a request's `labels` override)
    hypothesis_template: str = "This text is about {}."  # one hypothesis per label
    temperature: float = setting(0.05, gt=0)  # softmax temperature over the cosines

    def __post_init__(self) -> None:
        check_fields(self)
        if "{}" not in self.hypothesis_template:
            raise ConfigError("hypothesis_template", "must contain '{}' (the label)")


@dataclass(frozen=True, kw_only=True)
class ClassifierOptions:
    """`backend: transformers` / `text-classification` (backends/text.py)."""

    max_length: int = setting(512, ge=1)  # tokens kept per text

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class TritonOptions:
    """`backend: triton` (backends/triton.py): a model on a Triton Inference Server."""

    url: str  # the server's HTTP endpoint (host:port)
    model_name: str = ""  # the model's name on the server ("": the entry's source)
    model_version: str = ""  # "": the server's latest
    timeout_s: float = setting(30.0, gt=0)  # per request
    unload_on_close: bool = True  # ask the server to unload the model when ours unloads

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.url:
            raise ConfigError("url", "must not be empty")


#: backend name -> the dataclass its catalog options parse into
BACKEND_OPTIONS: dict[str, type] = {
    "embeddings": EmbeddingOptions,
    "zero-shot": ZeroShotOptions,
    "transformers": ClassifierOptions,
    "text-classification": ClassifierOptions,
    "efficientnet": ImageOptions,
    "torchvision": ImageOptions,
    "onnx": OnnxOptions,
    "triton": TritonOptions,
}


def options_class(backend: str) -> type:
    """The options dataclass of `backend` (NoOptions for one that declares none)."""
    return BACKEND_OPTIONS.get(backend, NoOptions)


def options_of(spec: Any, cls: type[T]) -> T:
    """A ModelSpec's typed backend options, as the backend `cls` expects them (ValueError when
    the entry was parsed for another backend)."""
    options = spec.backend_options
    if not isinstance(options, cls):
        raise ValueError(f"{spec.id}: options are {type(options).__name__}, not {cls.__name__}")
    return options
