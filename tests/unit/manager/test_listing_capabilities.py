"""The manager lists what each LLM serves (`capabilities`) before it loads: every local engine
serves tools and structured output; tools need a chat template; other models list none."""

from __future__ import annotations

import pytest

from modelyard.manager.entries import Entry
from modelyard.model_spec import ModelKind, ModelSpec

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("kind", "backend", "expected"),
    [
        (ModelKind.CHAT, "llm", {"chat": True, "tools": True, "structured_output": True}),
        (ModelKind.COMPLETION, "llm", {"chat": False, "tools": False, "structured_output": True}),
        (ModelKind.EMBEDDING, "transformers", None),
    ],
)
def test_an_unloaded_entry_lists_its_capabilities(
    kind: ModelKind, backend: str, expected: dict[str, bool] | None
) -> None:
    spec = ModelSpec(id="m", kind=kind, backend=backend, source="/nowhere")
    assert Entry(spec).describe_spec().get("capabilities") == expected
