"""The structured-output request fields: every spelling maps onto the same engine constraint,
and a malformed or doubled one is an InvalidParamError naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from modelyard.api import structured
from modelyard.api.protocol import ChatCompletionRequest
from modelyard.engine import constraints
from modelyard.engine.sampling_params import InvalidParamError

pytestmark = pytest.mark.unit

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def _request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], **fields)


@pytest.mark.parametrize(
    ("fields", "param", "constraint"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": SCHEMA},
                }
            },
            "response_format",
            constraints.json_schema(SCHEMA),
        ),
        (
            {"response_format": {"type": "json_object"}},
            "response_format",
            constraints.json_object(),
        ),
        (
            {"structured_outputs": {"json": SCHEMA}},
            "structured_outputs.json",
            constraints.json_schema(SCHEMA),
        ),
        (
            {"structured_outputs": {"regex": "a+"}},
            "structured_outputs.regex",
            constraints.regex("a+"),
        ),
        (
            {"structured_outputs": {"choice": ["a", "b"]}},
            "structured_outputs.choice",
            constraints.choice(["a", "b"]),
        ),
        (
            {"structured_outputs": {"grammar": 'start: "a"'}},
            "structured_outputs.grammar",
            constraints.grammar('start: "a"'),
        ),
        (
            {"guided_json": '{"type": "object", "properties": {"a": {"type": "integer"}}}'},
            "guided_json",
            constraints.json_schema(SCHEMA),
        ),
        ({"guided_regex": "a+"}, "guided_regex", constraints.regex("a+")),
        ({"guided_choice": ["a"]}, "guided_choice", constraints.choice(["a"])),
        ({"guided_grammar": 'start: "a"'}, "guided_grammar", constraints.grammar('start: "a"')),
    ],
)
def test_each_spelling_maps_onto_a_constraint(
    fields: dict[str, Any], param: str, constraint: constraints.Constraint
) -> None:
    body = _request(**fields)
    requested = body.requested_constraint()
    assert requested == structured.RequestedConstraint(param, constraint)
    assert body.to_sampling_params().constraint == constraint


def test_no_constraint_and_text_format() -> None:
    assert _request().requested_constraint() is None
    assert _request(response_format={"type": "text"}).to_sampling_params().constraint is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "s"}}},
            "response_format",
        ),
        ({"guided_json": "[1, 2"}, "guided_json"),
        ({"guided_json": [1]}, "guided_json"),
        ({"guided_regex": "a", "ignore_eos": True}, "ignore_eos"),
    ],
)
def test_malformed_fields_name_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidParamError) as info:
        _request(**fields).to_sampling_params()
    assert info.value.param == param


async def test_check_compiles_off_the_loop_and_names_the_field() -> None:
    await structured.check_constraint(None)
    await structured.check_constraint(_request(guided_regex="[0-9]+").requested_constraint())
    with pytest.raises(InvalidParamError, match="unclosed group") as info:
        await structured.check_constraint(_request(guided_regex="a(b").requested_constraint())
    assert info.value.param == "guided_regex"
