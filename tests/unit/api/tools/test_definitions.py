"""Tool fields: checks (400s naming the field) and the grammar forcing the calls."""

from __future__ import annotations

from typing import Any

import pytest

from modelyard.api.protocol import ChatCompletionRequest
from modelyard.api.tools.enforce import forced_calls
from modelyard.engine import constraints
from modelyard.engine.constraints import ConstraintKind
from modelyard.engine.sampling_params import InvalidParamError

pytestmark = pytest.mark.unit

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}
USER = {"role": "user", "content": "weather?"}


def request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [USER], **fields})


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
            "tools[0].function.name",
        ),
        ({"tools": [TOOL, TOOL]}, "tools[1].function.name"),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}
                ]
            },
            "tools[0].function.parameters",
        ),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {
                "tools": [TOOL],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "tool_choice",
        ),
    ],
)
def test_malformed_tool_fields_name_the_field(fields: dict[str, Any], param: str) -> None:
    body = request(**fields)

    def check() -> None:
        body.checked_tool_offer()
        body.to_sampling_params()

    with pytest.raises(InvalidParamError) as caught:
        check()
    assert caught.value.param == param


def test_a_tool_message_must_answer_an_earlier_call() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": "{}"},
    }
    assistant = {"role": "assistant", "content": None, "tool_calls": [call]}
    answer = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    ok = ChatCompletionRequest.model_validate({"model": "m", "messages": [USER, assistant, answer]})
    assert ok.checked_tool_offer() is None  # no tools offered this turn: accepted all the same
    assert ok.messages[1].as_template_message()["tool_calls"][0]["function"]["arguments"] == {}
    for bad in ({**answer, "tool_call_id": "call_2"}, {"role": "tool", "content": "x"}):
        body = ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [USER, assistant, bad]}
        )
        with pytest.raises(InvalidParamError) as caught:
            body.checked_tool_offer()
        assert caught.value.param == "messages[2].tool_call_id"


def test_auto_offers_the_tools_without_a_constraint_and_none_offers_nothing() -> None:
    auto = request(tools=[TOOL])
    offer = auto.checked_tool_offer()
    assert offer is not None
    assert offer.tools == [TOOL]
    assert not offer.required
    assert auto.to_sampling_params().constraint is None
    assert request(tools=[TOOL], tool_choice="none").checked_tool_offer() is None


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_required_and_named_choices_force_a_compiling_grammar(choice: object) -> None:
    other = {"type": "function", "function": {"name": "get_time"}}
    body = request(tools=[TOOL, other], tool_choice=choice)
    constraint = body.to_sampling_params().constraint
    assert constraint is not None
    assert constraint.kind is ConstraintKind.GRAMMAR
    constraints.check(constraint)
    named = isinstance(choice, dict)
    assert ("get_time" in constraint.spec) is not named
    assert ('("\\n" call)*' in constraint.spec) is not named  # a named function: one call


def test_forced_grammar_with_parallel_calls_off_allows_one_call() -> None:
    text = forced_calls({"f": PARAMS}, parallel=False).spec
    assert text.startswith("start: call\n")
    assert '"<tool_call>\\n" %json {' in text


def test_requests_offering_tools_keep_the_mistral_marker_forced_ones_do_not() -> None:
    kept = request(tools=[TOOL]).to_sampling_params().kept_special_tokens
    assert kept == ["[TOOL_CALLS]"]
    assert request().to_sampling_params().kept_special_tokens == []
    forced = request(tools=[TOOL], tool_choice="required").to_sampling_params()
    assert forced.kept_special_tokens == []
