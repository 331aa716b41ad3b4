"""Suite-wide settings: no hub access, quiet tokenizers, the test-only `echo` backend
registered. Area fixtures live in each area's conftest.py."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from fakes.echo import register_echo
from modelyard.engine.config import kernels_from_environment
from modelyard.runner.kernel_config import use_kernel_config

register_echo()
use_kernel_config(kernels_from_environment())  # what a runner built here without one uses
