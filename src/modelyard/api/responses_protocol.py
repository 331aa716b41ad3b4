"""The request body of POST /v1/responses (OpenAI's Responses API), and its translation onto
a chat completion request, so a response runs the chat path (template, tool offer, constraint).

Translation (`ResponsesRequest.to_chat`):
- `instructions` -> a leading system message; `input` (a string: one user message; or items)
  -> messages: `message` items keep their role (developer -> system) and join their text
  parts; `function_call` items join the assistant message before them as its `tool_calls`;
  a `function_call_output` becomes a `tool` message answering its `call_id`;
- `tools` (`{"type": "function", "name", "parameters"...}`) -> chat tools, `tool_choice`
  `{"type": "function", "name"}` -> chat's named choice;
- `text.format` -> `response_format`; `max_output_tokens` -> `max_completion_tokens`.

A chat error names the Responses field (`responses_params`): `tools[0].name`, `text.format`,
`max_output_tokens`, `input`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from modelyard.api.protocol import PRIORITY_LIMIT, ChatCompletionRequest
from modelyard.engine.sampling_params import INT64_MAX, INT64_MIN, InvalidParamError

_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_ROLES = frozenset({"user", "system", "developer", "assistant"})


class InputContent(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str  # input_text | output_text (others are refused)
    text: str = ""


class InputItem(BaseModel):
    """One `input` item: a message, a function call or a call's output (checked in to_chat)."""

    model_config = ConfigDict(extra="ignore")

    type: str | None = None  # "message" (or absent with a role), function_call(_output)
    role: str | None = None  # message: user | system | developer | assistant
    content: str | list[InputContent] | None = None  # message text
    call_id: str | None = None  # function_call(_output): the call
    name: str | None = None  # function_call: the function
    arguments: str | None = None  # function_call: JSON text
    output: str | None = None  # function_call_output: the result


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # JSON Schema of the arguments (an object)
    strict: bool | None = None  # accepted; forced calls always follow the schema


class NamedFunctionChoice(BaseModel):
    type: Literal["function"] = "function"
    name: str


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str = "schema"
    description: str | None = None
    json_schema: Any = Field(None, alias="schema")  # json_schema: the JSON Schema (required)
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: TextFormat = TextFormat.model_validate({"type": "text"})


class ResponsesRequest(BaseModel):
    """POST /v1/responses."""

    model_config = ConfigDict(extra="ignore")

    model: str
    input: str | list[InputItem]
    instructions: str | None = None  # a system message before the input (not carried over)
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    max_output_tokens: int | None = None  # None: up to the context length
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    priority: int = Field(0, ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)  # + the tenant's priority
    stream: bool = False
    store: bool = True  # keep the response (GET /v1/responses/{id}, previous_response_id)
    previous_response_id: str | None = None  # continue that stored response's conversation
    metadata: dict[str, str] | None = None  # returned as given

    def input_items(self) -> list[dict[str, Any]]:
        """`input` as a list of items (a string is one user message)."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        if not self.input and self.previous_response_id is None:
            raise InvalidParamError("input", "must not be empty")
        return [item.model_dump(exclude_none=True) for item in self.input]

    def to_chat(self, items: list[dict[str, Any]]) -> ChatCompletionRequest:
        """The chat request running this response over `items` (the whole conversation)."""
        messages = chat_messages(items)
        if self.instructions:
            messages.insert(0, {"role": "system", "content": self.instructions})
        if not messages:
            raise InvalidParamError("input", "must not be empty")
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "parallel_tool_calls": self.parallel_tool_calls,
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "priority": self.priority,
        }
        if self.tools:
            body["tools"] = [_chat_tool(t) for t in self.tools]
        choice = self.tool_choice
        if isinstance(choice, NamedFunctionChoice):
            body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        elif choice is not None:
            body["tool_choice"] = choice
        if self.text is not None:
            body["response_format"] = _response_format(self.text.format)
        return ChatCompletionRequest.model_validate(body)


def _chat_tool(tool: FunctionTool) -> dict[str, Any]:
    function = tool.model_dump(exclude_none=True, exclude={"type"})
    return {"type": "function", "function": function}


def _response_format(fmt: TextFormat) -> dict[str, Any]:
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    if fmt.json_schema is None:
        raise InvalidParamError("text.format.schema", "is required for json_schema")
    schema = {"name": fmt.name, "schema": fmt.json_schema, "strict": fmt.strict}
    return {"type": "json_schema", "json_schema": schema}


def chat_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages of Responses input items (InvalidParamError naming `input[i]`)."""
    messages: list[dict[str, Any]] = []
    calls: set[str] = set()
    for i, item in enumerate(items):
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            messages.append(_message(i, item))
        elif kind == "function_call":
            call_id, name = _required(i, item, "call_id"), _required(i, item, "name")
            function = {"name": name, "arguments": item.get("arguments") or "{}"}
            call: dict[str, Any] = {"id": call_id, "type": "function", "function": function}
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":  # else: the calls of its turn
                last = {"role": "assistant", "content": None}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
            calls.add(call_id)
        elif kind == "function_call_output":
            call_id = _required(i, item, "call_id")
            if call_id not in calls:
                message = f"{call_id!r} answers no earlier function_call"
                raise InvalidParamError(f"input[{i}].call_id", message)
            content = item.get("output") or ""
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        else:
            message = "must be message, function_call or function_call_output"
            raise InvalidParamError(f"input[{i}].type", message)
    return messages


def _message(i: int, item: dict[str, Any]) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise InvalidParamError(f"input[{i}].role", f"must be one of {sorted(_ROLES)}")
    content = item.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            if part.get("type") not in _TEXT_PARTS:
                message = "is not supported (only input_text and output_text)"
                raise InvalidParamError(f"input[{i}].content[{j}].type", message)
        content = "".join(part.get("text", "") for part in content)
    return {"role": role, "content": content or ""}


def _required(i: int, item: dict[str, Any], key: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidParamError(f"input[{i}].{key}", f"is required for {item.get('type')}")
    return value


#: Chat field names -> the Responses request's.
_RENAMES = (
    ("max_completion_tokens", "max_output_tokens"),
    ("response_format", "text.format"),
    ("messages", "input"),
)


@contextmanager
def responses_params() -> Iterator[None]:
    """Around the chat checks: InvalidParamErrors name the Responses request's fields."""
    try:
        yield
    except InvalidParamError as exc:
        param = exc.param.replace("].function.", "].")
        for chat_name, name in _RENAMES:
            if param.startswith(chat_name):
                param = name + param[len(chat_name) :]
        if param == exc.param:
            raise
        raise exc.renamed(param) from None
