"""Catalog `options` are parsed once, at catalog load, into the typed section of the entry's
kind: an LLM's whole engine config (`spec.llm`), any other model's backend options
(`spec.backend_options`); a bad one names its entry with a dotted path."""

from __future__ import annotations

import pytest

from fakes.echo import EchoOptions
from modelyard.backends.options import (
    ClassifierOptions,
    EmbeddingOptions,
    ImageOptions,
    NoOptions,
    OnnxOptions,
    TritonOptions,
    ZeroShotOptions,
)
from modelyard.config_parse import ConfigError
from modelyard.engine.config import EngineConfig
from modelyard.manager.catalog import load_catalog, parse_catalog
from modelyard.model_spec import ModelSpec

pytestmark = pytest.mark.unit


def _one(entry: dict[str, object]) -> ModelSpec:
    (spec,) = parse_catalog([entry])
    return spec


def test_an_llm_entry_carries_its_whole_engine_config() -> None:
    spec = _one(
        {
            "id": "chat",
            "kind": "chat",
            "backend": "llm",
            "source": "m.gguf",
            "options": {
                "dtype": "bfloat16",
                "kv_cache_bytes": 1024,
                "block_size": 32,
                "max_num_seqs": 4,
                "draft": "ngram",
                "num_speculative_tokens": 3,
                "lora_modules": {"finance": "/a/finance"},
                "max_loras": 2,
                "gguf_blocks": "on",
            },
        }
    )
    llm = spec.llm
    assert isinstance(llm, EngineConfig)
    assert spec.backend_options is None
    assert (llm.model.model, llm.model.dtype, llm.model.gguf_blocks) == ("m.gguf", "bfloat16", "on")
    assert (llm.cache.kv_cache_bytes, llm.cache.block_size) == (1024, 32)
    assert llm.scheduler.max_num_seqs == 4
    assert llm.speculative is not None
    assert llm.speculative.num_speculative_tokens == 3
    assert llm.lora is not None
    assert dict(llm.lora.modules) == {"finance": "/a/finance"}
    assert llm.lora.max_loras == 2
    assert llm.kernels.isa in ("amx", "avx512-bf16", "avx512", "avx2", "generic")


@pytest.mark.parametrize(
    ("backend", "options", "typed"),
    [
        ("embeddings", {"max_length": 128}, EmbeddingOptions(max_length=128)),
        (
            "zero-shot",
            {"labels": ["a", "b"], "temperature": 0.1},
            ZeroShotOptions(labels=("a", "b"), temperature=0.1),
        ),
        ("transformers", {}, ClassifierOptions()),
        ("torchvision", {"weights": "/w.pth"}, ImageOptions(weights="/w.pth")),
        ("efficientnet", None, ImageOptions()),
        (
            "onnx",
            {"preset": "text-embedding", "tokenizer": "/tok", "intra_op_num_threads": 2},
            OnnxOptions(preset="text-embedding", tokenizer="/tok", intra_op_num_threads=2),
        ),
        ("triton", {"url": "localhost:8000"}, TritonOptions(url="localhost:8000")),
        ("echo", {"scale": 2, "fail_on": "boom"}, EchoOptions(scale=2.0, fail_on="boom")),
        ("unregistered", {}, NoOptions()),
    ],
)
def test_a_predictor_entry_carries_its_backends_options(
    backend: str, options: dict[str, object] | None, typed: object
) -> None:
    entry = {"id": "m", "kind": "embedding", "backend": backend, "options": options}
    spec = _one(entry)
    assert spec.backend_options == typed
    assert spec.llm is None


def test_an_unknown_option_names_the_entry_and_its_path() -> None:
    entries = [
        {"id": "ok", "kind": "embedding", "backend": "embeddings"},
        {"id": "bad", "kind": "embedding", "backend": "embeddings", "options": {"max_len": 9}},
    ]
    with pytest.raises(
        ConfigError,
        match=r"^catalog\.models\[1\]\.options: unknown key\(s\) "
        r"\['max_len'\].*\(model 'bad'\)$",
    ):
        parse_catalog(entries)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"kind": "chat", "source": "m.gguf", "options": {"kv_cache_bytes": 0}},
            r"catalog\.models\[0\]\.options\.kv_cache_bytes: must be >= 1, not 0 \(model 'x'\)",
        ),
        (
            {"kind": "chat", "source": "m.gguf", "options": {"max_num_sequences": 2}},
            r"catalog\.models\[0\]\.options: unknown key\(s\) \['max_num_sequences'\]",
        ),
        (
            {"kind": "embedding", "backend": "onnx", "options": {"preset": "audio"}},
            r"catalog\.models\[0\]\.options\.preset: must be one of",
        ),
        (
            {"kind": "embedding", "backend": "triton", "options": {}},
            r"catalog\.models\[0\]\.options: .*url",
        ),
        (
            {"kind": "chat", "source": "m.gguf", "options": {"lora_modules": ["a"]}},
            r"catalog\.models\[0\]\.options\.lora_modules: must be a mapping",
        ),
    ],
)
def test_a_bad_value_is_a_dotted_path_error(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_catalog([{"id": "x", **entry}])


def test_the_default_catalog_is_typed_and_needs_no_test_backend() -> None:
    catalog = load_catalog(None)
    for spec in catalog:
        assert spec.backend != "echo"
        if spec.kind.is_llm:
            assert spec.llm is not None
        else:
            assert spec.backend_options is not None
    chat = catalog.resolve("smollm2")
    assert chat.llm is not None
    assert chat.llm.speculative is not None
    assert catalog.resolve("minilm-int8-onnx").backend_options.preset == "text-embedding"
