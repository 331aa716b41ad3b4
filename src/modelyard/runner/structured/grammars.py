"""Compiled grammars, one per distinct constraint (a bounded LRU cache).

llguidance compiles a grammar against the tokenizer when a matcher is built; a matcher's
`deep_copy` shares the compiled grammar and lexer. The cache keeps one fresh matcher per
constraint (its prototype) and hands out copies, so a constraint is compiled once however
many requests (and `n` samples) use it.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import llguidance

from modelyard.engine.constraints import Constraint, ConstraintError, grammar_text, parser_limits

#: Distinct constraints kept compiled (least recently used dropped first).
DEFAULT_CAPACITY = 256


class GrammarCache:
    """Constraint -> compiled prototype matcher, bounded (least recently used out first)."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._tokenizer = tokenizer
        self._capacity = capacity
        self._prototypes: OrderedDict[Constraint, llguidance.LLMatcher] = OrderedDict()
        self.compiles = 0  # grammars compiled so far
        self.compile_seconds = 0.0  # time spent compiling them

    def __len__(self) -> int:
        return len(self._prototypes)

    def matcher(self, constraint: Constraint) -> llguidance.LLMatcher:
        """A fresh matcher for the constraint; ConstraintError when it does not compile."""
        prototype = self._prototypes.get(constraint)
        if prototype is None:
            prototype = self._compile(constraint)
            self._prototypes[constraint] = prototype
            if len(self._prototypes) > self._capacity:
                self._prototypes.popitem(last=False)
        else:
            self._prototypes.move_to_end(constraint)
        return prototype.deep_copy()

    def _compile(self, constraint: Constraint) -> llguidance.LLMatcher:
        started = time.perf_counter()
        matcher = llguidance.LLMatcher(
            self._tokenizer, grammar_text(constraint), log_level=0, limits=parser_limits()
        )
        self.compiles += 1
        self.compile_seconds += time.perf_counter() - started
        if matcher.is_error():
            raise ConstraintError(f"{constraint.kind} constraint: {matcher.get_error()[:500]}")
        return matcher
