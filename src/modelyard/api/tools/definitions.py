"""Tool fields of a chat request (OpenAI's `tools`, `tool_choice`, `parallel_tool_calls`) and
the tool messages of a conversation, checked into a `ToolOffer`.

Checks (each an InvalidParamError, a 400 naming the field): a function name is 1-64 letters,
digits, `_` or `-`, unique among the tools; `parameters` is a JSON Schema of type object;
`tool_choice` `"required"` or a named function needs tools, and the name must be one of them;
a `role: "tool"` message answers a `tool_call_id` of an earlier assistant `tool_calls`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from modelyard.api.tools.enforce import auto_calls, forced_calls
from modelyard.api.tools.mistral import MARKER as MISTRAL_MARKER
from modelyard.engine.constraints import Constraint
from modelyard.engine.sampling_params import InvalidParamError

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: The schema of a function declared without parameters.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # JSON Schema of the arguments (an object)
    strict: bool | None = None  # accepted; calls held to grammars always follow the schema


class ToolDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text


class AssistantToolCall(BaseModel):
    """An entry of an assistant message's `tool_calls` (an earlier turn)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


@dataclass(frozen=True, slots=True)
class ToolOffer:
    """The tools a request offers the model, and how it must use them."""

    tools: list[dict[str, Any]]  # OpenAI tool dicts, for the chat template
    required: bool  # tool_choice "required" or a named function
    named: str | None  # the function tool_choice names
    parallel: bool  # parallel_tool_calls
    # auto mode: the grammar keeping calls to the schemas once the model starts one, for
    # models that write Hermes calls (set once it compiles: api/routes/openai.prepared_chat)
    auto_grammar: Constraint | None = None

    def kept_special_tokens(self) -> list[str]:
        """Call markers that are special tokens, which the text must keep for the parser to
        see them (Mistral's `[TOOL_CALLS]`); none for forced calls (Hermes text)."""
        return [] if self.required else [MISTRAL_MARKER]

    def constraint(self) -> Constraint | None:
        """The grammar forcing the calls (required or named), else None (auto)."""
        if not self.required:
            return None
        functions = [t["function"] for t in self.tools]
        if self.named is not None:
            functions = [f for f in functions if f["name"] == self.named]
        return forced_calls(_schemas(functions), parallel=self.parallel and self.named is None)

    def auto_constraint(self) -> Constraint | None:
        """In auto mode, the grammar of free text then calls valid against the schemas (Hermes
        blocks, api/tools/enforce.py); None when calls are forced."""
        if self.required:
            return None
        functions = [t["function"] for t in self.tools]
        return auto_calls(_schemas(functions), parallel=self.parallel)


def _schemas(functions: list[dict[str, Any]]) -> dict[str, Any]:
    return {f["name"]: f.get("parameters") or NO_PARAMETERS for f in functions}


class ToolFields(BaseModel):
    """The tool fields of POST /v1/chat/completions."""

    model_config = ConfigDict(extra="ignore")

    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None  # None: "auto" with tools, "none" without
    parallel_tool_calls: bool = True

    def tool_offer(self) -> ToolOffer | None:
        """The checked offer; None when no tools are offered (none given, or "none")."""
        names = _check_tools(self.tools or [])
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            known = ", ".join(names) or "no tools"
            message = f"names function {choice.function.name!r}, not one of the tools ({known})"
            raise InvalidParamError("tool_choice", message)
        if choice == "required" and not names:
            raise InvalidParamError("tool_choice", '"required" needs tools')
        if not names or choice == "none":
            return None
        return ToolOffer(
            tools=[t.model_dump(exclude_none=True) for t in self.tools or []],
            required=choice == "required" or isinstance(choice, NamedToolChoice),
            named=choice.function.name if isinstance(choice, NamedToolChoice) else None,
            parallel=self.parallel_tool_calls,
        )


def _check_tools(tools: list[ToolDefinition]) -> list[str]:
    names: list[str] = []
    for i, tool in enumerate(tools):
        function = tool.function
        param = f"tools[{i}].function"
        if not _NAME.fullmatch(function.name):
            message = "must be 1-64 letters, digits, underscores or dashes"
            raise InvalidParamError(f"{param}.name", message)
        if function.name in names:
            raise InvalidParamError(f"{param}.name", f"{function.name!r} is given twice")
        schema = function.parameters
        if schema is not None and schema.get("type", "object") != "object":
            raise InvalidParamError(f"{param}.parameters", "must be a JSON Schema of an object")
        names.append(function.name)
    return names


def check_tool_messages(messages: Sequence[tuple[str, Any, str | None]]) -> None:
    """Each (role, tool_calls, tool_call_id): a tool message answers an earlier call id."""
    ids: set[str] = set()
    for i, (role, tool_calls, tool_call_id) in enumerate(messages):
        ids.update(call.id for call in tool_calls or [])
        if role != "tool":
            continue
        if tool_call_id is None:
            raise InvalidParamError(f"messages[{i}].tool_call_id", "is required for role tool")
        if tool_call_id not in ids:
            message = f"{tool_call_id!r} answers no earlier assistant tool_calls id"
            raise InvalidParamError(f"messages[{i}].tool_call_id", message)
