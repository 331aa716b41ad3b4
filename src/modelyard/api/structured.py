"""Structured-output request fields, and their mapping onto an engine `Constraint`.

Accepted spellings (at most one per request, else a 400):
- OpenAI `response_format`: `{"type": "text"}` (no constraint), `{"type": "json_object"}`,
  `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`;
- vLLM `structured_outputs`: one of `json` (a schema, object or string), `regex`, `choice`,
  `grammar` (Lark, or GBNF/EBNF), `json_object: true`;
- vLLM's older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`.

`check_constraint` compiles the constraint (without a tokenizer) in a thread, bounded by
COMPILE_TIMEOUT_S, so an unsupported schema keyword, a regex or grammar that does not compile,
or one too slow to compile is a 400 naming the field before anything reaches the engine.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from modelyard.engine import constraints
from modelyard.engine.constraints import Constraint, ConstraintError
from modelyard.engine.sampling_params import InvalidParamError

#: Longest time a constraint may take to compile in the API process (then a 400).
COMPILE_TIMEOUT_S = 10.0


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = "schema"
    description: str | None = None
    json_schema: Any = Field(None, alias="schema")  # the JSON Schema (required)
    strict: bool | None = None  # accepted; the output always follows the schema


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsOptions(BaseModel):
    """vLLM's `structured_outputs` object."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    json_schema: Any = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


@dataclass(frozen=True, slots=True)
class RequestedConstraint:
    param: str  # the request field it came from (named in a 400)
    constraint: Constraint


class StructuredFields(BaseModel):
    """The structured-output fields of the generating routes."""

    model_config = ConfigDict(extra="ignore")

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsOptions | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def requested_constraint(self) -> RequestedConstraint | None:
        """The one constraint the request asks for (InvalidParamError when malformed or more
        than one is given)."""
        found = [c for c in (*self._openai(), *self._vllm(), *self._guided()) if c is not None]
        if len(found) > 1:
            names = ", ".join(c.param for c in found)
            raise InvalidParamError(found[1].param, f"conflicts with {names}: give one")
        return found[0] if found else None

    def _openai(self) -> list[RequestedConstraint | None]:
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return []
        if fmt.type == "json_object":
            return [RequestedConstraint("response_format", constraints.json_object())]
        if fmt.json_schema is None or fmt.json_schema.json_schema is None:
            raise InvalidParamError("response_format", "json_schema.schema is required")
        schema = fmt.json_schema.json_schema
        return [_json("response_format", schema)]

    def _vllm(self) -> list[RequestedConstraint | None]:
        opts = self.structured_outputs
        if opts is None:
            return []
        name = "structured_outputs"
        return [
            _json(f"{name}.json", opts.json_schema) if opts.json_schema is not None else None,
            _regex(f"{name}.regex", opts.regex),
            _choice(f"{name}.choice", opts.choice),
            _grammar(f"{name}.grammar", opts.grammar),
            RequestedConstraint(f"{name}.json_object", constraints.json_object())
            if opts.json_object
            else None,
        ]

    def _guided(self) -> list[RequestedConstraint | None]:
        return [
            _json("guided_json", self.guided_json) if self.guided_json is not None else None,
            _regex("guided_regex", self.guided_regex),
            _choice("guided_choice", self.guided_choice),
            _grammar("guided_grammar", self.guided_grammar),
        ]


async def check_constraint(requested: RequestedConstraint | None) -> None:
    """Compile the constraint off the event loop; InvalidParamError (a 400) when it does not
    compile or takes longer than COMPILE_TIMEOUT_S."""
    if requested is None:
        return
    try:
        await asyncio.wait_for(
            asyncio.to_thread(constraints.check, requested.constraint), COMPILE_TIMEOUT_S
        )
    except TimeoutError:
        message = f"took longer than {COMPILE_TIMEOUT_S:g} s to compile"
        raise InvalidParamError(requested.param, message) from None
    except ConstraintError as exc:
        raise InvalidParamError(requested.param, str(exc)) from None


async def compiles(constraint: Constraint) -> bool:
    """Whether a constraint the server adds on its own compiles in time (off the event
    loop); one that does not is left out rather than refused."""
    try:
        await asyncio.wait_for(asyncio.to_thread(constraints.check, constraint), COMPILE_TIMEOUT_S)
    except (TimeoutError, ConstraintError):
        return False
    return True


def _json(param: str, schema: object) -> RequestedConstraint:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise InvalidParamError(param, "must be a JSON Schema (object)") from None
    if not isinstance(schema, dict | bool):
        raise InvalidParamError(param, "must be a JSON Schema (object)")
    return RequestedConstraint(param, constraints.json_schema(schema))


def _regex(param: str, pattern: str | None) -> RequestedConstraint | None:
    return None if pattern is None else RequestedConstraint(param, constraints.regex(pattern))


def _choice(param: str, options: list[str] | None) -> RequestedConstraint | None:
    return None if options is None else RequestedConstraint(param, constraints.choice(options))


def _grammar(param: str, text: str | None) -> RequestedConstraint | None:
    return None if text is None else RequestedConstraint(param, constraints.grammar(text))
