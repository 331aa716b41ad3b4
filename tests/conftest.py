"""Suite-wide settings: no hub access, quiet tokenizers, float32 products on GGUF blocks, the
test-only `echo` backend registered. Area fixtures live in each area's conftest.py."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# GGUF blocks times float32 activations unless a test asks for int8 ones (test_gguf_dot.py, the
# quality test's q8 model, the q8 e2e server): the reference comparisons hold to summation order
os.environ.setdefault("MODELYARD_GGUF_DOT", "float")

from fakes.echo import register_echo
from modelyard.build_tools import path_with_ninja

register_echo()
# a runner built in a test process may build the kernels on first use: torch's builder runs
# ninja from PATH (the venv's bin folder is not on it when its python is run directly)
os.environ["PATH"] = path_with_ninja(os.environ)
