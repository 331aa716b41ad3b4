"""The config loader and `modelyard serve` option handling (no server started)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from modelyard.api import cli
from modelyard.config import load_config

pytestmark = pytest.mark.unit


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_without_a_file() -> None:
    config = load_config(None)
    assert (config.server.host, config.server.port) == ("127.0.0.1", 8000)
    assert config.server.request_timeout_s == 300
    assert (config.server.textbook.max_tokens, config.server.textbook.temperature) == (50, 0.7)


def test_file_sections_are_read(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "server:\n  port: 9000\n  drain_timeout_s: 5\n  textbook: {max_tokens: 20}\n"
        "engine: {dtype: bfloat16, max_num_seqs: 8}\n"
        "manager: {max_models: 2}\ngateway: {auth: off}\n"
    )
    config = load_config(path)
    assert (config.server.port, config.server.drain_timeout_s) == (9000, 5)
    assert config.server.textbook.max_tokens == 20
    assert config.engine.overrides() == {"dtype": "bfloat16", "max_num_seqs": 8}
    assert config.manager.max_models == 2
    assert config.gateway.auth == "off"  # YAML reads off as false


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("servr: {}\n", "unknown key.*servr"),
        ("server: {prot: 1}\n", "prot"),
        ("server: {port: 70000}\n", "server.port"),
        ("server: {request_timeout_s: 0}\n", "request_timeout_s"),
        ("engine: {dtype: float16}\n", "engine.dtype"),
        ("engine: {max_num_seqs: 0}\n", "engine.max_num_seqs"),
        ("server: [1, 2]\n", "must be a mapping"),
    ],
)
def test_invalid_config_raises_value_error(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=fragment):
        load_config(path)


def test_command_line_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("server: {port: 9000}\nengine: {max_num_seqs: 8}\n")
    args = _args(
        "--config", str(path), "--port", "9100", "--max-num-seqs", "4", "--kv-cache-bytes", "1024"
    )
    config = cli.config_from_args(args)
    assert config.server.port == 9100
    assert config.engine.overrides() == {"max_num_seqs": 4, "kv_cache_bytes": 1024}
    assert args.preload is True
    assert _args("--no-preload").preload is False


def test_catalog_gets_engine_overrides_and_no_preload() -> None:
    config = cli.config_from_args(_args("--dtype", "bfloat16", "--max-num-seqs", "4"))
    catalog = cli.build_catalog(None, config.engine, preload=False)
    chat = catalog.resolve("smollm2-135m-instruct")
    assert chat.options["dtype"] == "bfloat16"
    assert chat.options["max_num_seqs"] == 4
    assert chat.options["max_model_len"] == 2048  # untouched catalog option
    assert not any(spec.preload for spec in catalog)
    embedding = catalog.resolve("all-minilm-l6-v2")
    assert "max_num_seqs" not in embedding.options


def test_run_reports_invalid_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("server: {port: -1}\n")
    assert cli.run(_args("--config", str(path))) == 2
    assert "server.port" in capsys.readouterr().err


def test_lora_root_from_the_file_and_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("server: {lora_root: /srv/adapters}\n")
    assert load_config(path).server.lora_root == "/srv/adapters"
    assert load_config(None).server.lora_root is None  # any folder
    config = cli.config_from_args(_args("--config", str(path), "--lora-root", "/srv/other"))
    assert config.server.lora_root == "/srv/other"
    path.write_text("server: {lora_root: ''}\n")
    with pytest.raises(ValueError, match=r"server\.lora_root"):
        load_config(path)


def _gguf(path: Path, template: str | None) -> Path:
    """A header-only GGUF file (one tiny tensor), with or without a chat template."""
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    if template is not None:
        writer.add_chat_template(template)
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_serve_one_gguf_file_without_a_catalog(tmp_path: Path) -> None:
    path = _gguf(tmp_path / "tiny-base.gguf", None)
    config = cli.config_from_args(_args(str(path), "--max-num-seqs", "2"))
    assert config.model == str(path)
    catalog = cli.build_catalog(config.catalog, config.engine, preload=True, model=config.model)
    (spec,) = list(catalog)
    assert (spec.id, spec.kind, spec.backend) == ("tiny-base", "completion", "llm")
    assert spec.source == str(path.resolve())
    assert spec.preload
    assert spec.options["max_num_seqs"] == 2


def test_served_model_name_and_chat_template(tmp_path: Path) -> None:
    path = _gguf(tmp_path / "tiny-it.gguf", "{{ messages[0]['content'] }}")
    config = cli.config_from_args(_args("--model", str(path), "--served-model-name", "mine"))
    catalog = cli.build_catalog(
        None, config.engine, preload=False, model=config.model, served_model_name="mine"
    )
    assert catalog.resolve("mine").kind == "chat"
    with pytest.raises(ValueError, match="not both"):
        cli.config_from_args(_args(str(path), "--catalog", "models.yaml"))
