"""modelyard: one server for LLMs and ordinary models on limited hardware.

Public API: `LLM` (offline batch generation) and `SamplingParams`. Everything else is internal
and may change.
"""

from __future__ import annotations

from typing import Any

from modelyard.engine.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "__version__"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # LLM imports torch; keep `import modelyard` light for the CLI and the gateway.
    if name == "LLM":
        import importlib

        return importlib.import_module("modelyard.engine.llm").LLM
    raise AttributeError(f"module 'modelyard' has no attribute {name!r}")
