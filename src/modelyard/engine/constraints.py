"""Output constraints (structured output): what a request's text must match.

A `Constraint` is a wire value (it rides in `SamplingParams.constraint`): a kind and its
canonical text, so two requests asking for the same thing carry equal constraints and the
engine compiles the grammar once for both (runner/structured). Kinds:

- `json_schema`: `spec` is the JSON Schema, serialised without spaces (keys keep their order:
  properties are generated in the schema's order);
- `json_object`: any JSON object (`spec` is empty);
- `regex`: the whole output matches the regular expression (Rust `regex` syntax);
- `choice`: the output is exactly one of the strings (`spec`: a JSON list of them);
- `grammar`: a Lark grammar (llguidance's dialect; GBNF/EBNF is translated).

A later kind (a tool call's grammar) is one more enum value and one more branch of
`grammar_text`. `check` validates a constraint without a tokenizer (the API process calls it
off its event loop, with a time limit, and answers a 400 naming the problem).
JSON outputs are compact: no whitespace between tokens, `,` and `:` as separators.
"""

from __future__ import annotations

import enum
import functools
import json
from typing import TYPE_CHECKING

import llguidance
import msgspec

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

#: Resource limits of grammar compilation: a constraint past them is refused (a 400).
COMPILE_LIMITS = {"initial_lexer_fuel": 1_000_000, "max_grammar_size": 200_000}
#: JSON compile options: compact output, unknown keywords are an error.
_JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ",",
    "key_separator": ":",
}
#: Longest constraint text accepted (characters).
MAX_SPEC_CHARS = 256 * 1024


class ConstraintError(ValueError):
    """A constraint that cannot be compiled; the message says why."""


class ConstraintKind(enum.StrEnum):
    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    CHOICE = "choice"
    GRAMMAR = "grammar"


class Constraint(msgspec.Struct, frozen=True, kw_only=True):
    """One output constraint; equal constraints share one compiled grammar (hashable)."""

    kind: ConstraintKind
    spec: str = ""  # canonical text, see the module docstring


def json_schema(schema: object) -> Constraint:
    """A JSON Schema constraint (the schema as parsed JSON: dict or bool)."""
    return Constraint(kind=ConstraintKind.JSON_SCHEMA, spec=_canonical_json(schema))


def json_object() -> Constraint:
    return Constraint(kind=ConstraintKind.JSON_OBJECT)


def regex(pattern: str) -> Constraint:
    return Constraint(kind=ConstraintKind.REGEX, spec=pattern)


def choice(options: list[str]) -> Constraint:
    return Constraint(kind=ConstraintKind.CHOICE, spec=json.dumps(options, ensure_ascii=False))


def grammar(text: str) -> Constraint:
    return Constraint(kind=ConstraintKind.GRAMMAR, spec=text)


def grammar_text(constraint: Constraint) -> str:
    """The llguidance grammar of a constraint (ValueError when its spec is malformed)."""
    kind, spec = constraint.kind, constraint.spec
    if kind is ConstraintKind.JSON_SCHEMA:
        return llguidance.LLMatcher.grammar_from_json_schema(spec, defaults=_JSON_OPTIONS)
    if kind is ConstraintKind.JSON_OBJECT:
        schema = '{"type":"object"}'
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
    if kind is ConstraintKind.REGEX:
        return llguidance.LLMatcher.grammar_from_regex(spec)
    if kind is ConstraintKind.CHOICE:
        options = json.loads(spec)
        alternatives = " | ".join(json.dumps(o, ensure_ascii=False) for o in options)
        return llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}")
    return llguidance.LLMatcher.grammar_from_lark(_as_lark(spec))


def parser_limits() -> llguidance.LLParserLimits:
    return llguidance.LLParserLimits(**COMPILE_LIMITS)  # type: ignore[arg-type]


def check(constraint: Constraint) -> None:
    """Raise ConstraintError(why) when the constraint cannot be compiled: a schema
    with an unsupported keyword, a regex or grammar that does not parse, one over the limits.
    The verdicts of recent constraints are kept: clients send the same schema and tools on
    every turn, and each is validated once."""
    problem = _problem(constraint)
    if problem is not None:
        raise ConstraintError(problem)


@functools.lru_cache(maxsize=256)
def _problem(constraint: Constraint) -> str | None:
    if len(constraint.spec) > MAX_SPEC_CHARS:
        return f"is longer than {MAX_SPEC_CHARS} characters"
    if constraint.kind is ConstraintKind.CHOICE and not json.loads(constraint.spec):
        return "must list at least one choice"
    try:
        text = grammar_text(constraint)
    except ValueError as exc:
        return f"is invalid: {exc}"
    error = llguidance.LLMatcher.validate_grammar(text, limits=parser_limits())
    return f"is invalid: {error.strip()[:500]}" if error else None


def _canonical_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _as_lark(text: str) -> str:
    """Lark as is; a GBNF grammar (`root ::= ...`) translated to Lark."""
    if "::=" in text:
        from llguidance.gbnf_to_lark import gbnf_to_lark

        return str(gbnf_to_lark(text))
    return text
