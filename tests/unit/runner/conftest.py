"""Session-scoped tiny random models for the runner tests (built with save_pretrained)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from runner_driver import tiny_configs


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> folder of a tiny random model (llama, llama_tied, qwen2, gpt2, opt)."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("tiny_models")
    folders: dict[str, Path] = {}
    for i, (name, config) in enumerate(tiny_configs().items()):
        torch.manual_seed(1234 + i)
        model = AutoModelForCausalLM.from_config(config)
        if name == "qwen2":  # make the q/k/v biases matter
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                    torch.nn.init.normal_(proj.bias, std=0.5)
        folders[name] = root / name
        model.save_pretrained(folders[name])
    return folders
