"""Structured output on the runner's side: grammars compiled once per constraint, a matcher per
request, per-row token masks applied by the sampler (see `matchers` for the per-step pipeline)."""

from modelyard.runner.structured.grammars import GrammarCache
from modelyard.runner.structured.masks import TokenMasks, apply_masks
from modelyard.runner.structured.matchers import StructuredOutputs

__all__ = ["GrammarCache", "StructuredOutputs", "TokenMasks", "apply_masks"]
