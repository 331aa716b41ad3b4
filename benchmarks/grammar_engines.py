"""Compare llguidance and xgrammar on this engine's CPU path (not a test):
`python benchmarks/grammar_engines.py [--tokenizer FOLDER]` (xgrammar is not a dependency:
`pip install xgrammar==0.2.9` first to time it too).

With the default model's tokenizer (49,152 tokens) and a typical schema (an object with a bounded
string, a bounded integer, an array of enums and a nested object with a pattern): the tokenizer
setup, the compile time of the schema, and the time to fill one step's token masks while
following a fixed answer token by token, at batch 1 and 32. docs/structured-output.md has the
figures and the choice.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 200},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {
            "type": "array",
            "items": {"type": "string", "enum": ["a", "b", "c"]},
            "maxItems": 3,
        },
        "addr": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "tags", "addr"],
    "additionalProperties": False,
}
ANSWER = {
    "name": "Bob the builder from the far away land of Sussex",
    "age": 42,
    "tags": ["a", "b"],
    "addr": {
        "city": "Paris is a lovely city in the north of France, with many museums",
        "zip": "75001",
    },
}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def llguidance_figures(tokenizer: Any, ids: list[int], vocab: int) -> None:
    import llguidance
    import llguidance.hf

    tok, setup = _timed(lambda: llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab))
    opts: llguidance.JsonCompileOptions = {
        "whitespace_flexible": False,
        "item_separator": ",",
        "key_separator": ":",
    }  # type: ignore[attr-defined]
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults=opts)
    _, compile_s = _timed(lambda: llguidance.LLMatcher(tok, grammar))
    print(f"llguidance: tokenizer {_ms(setup)}, compile {_ms(compile_s)}")
    for batch in (1, 32):
        matchers = [llguidance.LLMatcher(tok, grammar) for _ in range(batch)]
        bitmask = torch.zeros(batch, (vocab + 31) // 32, dtype=torch.int32)
        total = 0.0
        for token in ids:
            started = time.perf_counter()
            for j, m in enumerate(matchers):
                row = bitmask[j]
                m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)
            total += time.perf_counter() - started
            for m in matchers:
                m.consume_token(token)
        print(f"llguidance: mask per step at batch {batch}: {_ms(total / len(ids))}")


def xgrammar_figures(tokenizer: Any, ids: list[int], vocab: int) -> None:
    try:
        import xgrammar as xgr
    except ImportError:
        print("xgrammar: not installed (pip install xgrammar==0.2.9)")
        return
    info, setup = _timed(lambda: xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab))
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    text = json.dumps(SCHEMA)
    compiled, compile_s = _timed(
        lambda: compiler.compile_json_schema(text, any_whitespace=False, separators=(",", ":"))
    )
    print(f"xgrammar: tokenizer {_ms(setup)}, compile {_ms(compile_s)}")
    for batch in (1, 32):
        matchers = [xgr.GrammarMatcher(compiled) for _ in range(batch)]
        bitmask = xgr.allocate_token_bitmask(batch, vocab)
        total = 0.0
        for token in ids:
            started = time.perf_counter()
            for j, m in enumerate(matchers):
                m.fill_next_token_bitmask(bitmask, j)
            total += time.perf_counter() - started
            for m in matchers:
                m.accept_token(token)
        print(f"xgrammar: mask per step at batch {batch}: {_ms(total / len(ids))}")


def main() -> None:
    from transformers import AutoTokenizer

    from modelyard.cache_dir import cache_dir_from_environment
    from modelyard.runner.loader import DEFAULT_MODEL, resolve_model

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokenizer", help="a tokenizer folder (default: the default model's)")
    args = parser.parse_args()
    folder = args.tokenizer or str(
        resolve_model(DEFAULT_MODEL, cache_dir_from_environment()).tokenizer_path
    )
    tokenizer = AutoTokenizer.from_pretrained(folder)
    vocab = len(tokenizer)
    ids = tokenizer.encode(json.dumps(ANSWER, separators=(",", ":")), add_special_tokens=False)
    threads = torch.get_num_threads()
    print(f"tokenizer {folder}: {vocab} tokens; answer of {len(ids)} tokens; {threads} threads")
    llguidance_figures(tokenizer, ids, vocab)
    xgrammar_figures(tokenizer, ids, vocab)


if __name__ == "__main__":
    main()
