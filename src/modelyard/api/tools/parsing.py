"""Tool calls out of completions: the parser of a model, the `message` of a whole completion and
the `delta.tool_calls` of a streamed one.

Streaming (`ToolCallStream`), per choice: text before the first call marker streams as
`delta.content`, except an end that may begin a marker (held back until it is known); once a
marker is seen, each call streams as OpenAI and vLLM stream them: as soon as its name is known,
a first `tool_calls` entry with index, id, type, function.name and arguments "", then the
arguments in fragments as the model writes them (entries with the index and
`function.arguments` only). The fragments are the growth of the parse's raw arguments
(api/tools/scan.py), so a call's fragments add up to `function.arguments` of the non-streamed
message for the same text, a call cut by max_tokens included (both carry what was written). At
the end, content the whole-text parse finds beyond what was sent (text after the calls) is sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from modelyard.api.tools.base import ParsedCall, ParsedOutput, ToolParser, new_call_id
from modelyard.api.tools.definitions import ToolOffer
from modelyard.api.tools.hermes import HermesParser
from modelyard.api.tools.llama3 import Llama3JsonParser
from modelyard.api.tools.mistral import MistralParser
from modelyard.engine.client.chat_template import ToolFormat, chat_template_of, tool_format_of
from modelyard.engine.client.protocol import LLMClient, Tokenizer
from modelyard.engine.sampling_params import SamplingParams

_PARSERS: dict[ToolFormat, type[ToolParser]] = {
    ToolFormat.HERMES: HermesParser,
    ToolFormat.LLAMA3_JSON: Llama3JsonParser,
    ToolFormat.MISTRAL: MistralParser,
}


def parser_for(tool_format: ToolFormat) -> ToolParser:
    """The parser of a call format (engine/client/chat_template.tool_format_of picks it)."""
    return _PARSERS[tool_format]()


def tool_calling(offer: ToolOffer, tokenizer: Tokenizer) -> ToolCalling:
    """How to read the completions of a request offering tools to the model of `tokenizer`:
    forced calls are Hermes blocks (api/tools/enforce.py), free ones the model's format."""
    if offer.required:
        tool_format = ToolFormat.HERMES
    else:
        tool_format = tool_format_of(chat_template_of(tokenizer))
    named = offer.named is not None
    return ToolCalling(parser_for(tool_format), offer.parallel, named=named, forced=offer.required)


def with_auto_grammar(offer: ToolOffer, llm: LLMClient, params: SamplingParams) -> SamplingParams:
    """The params of a request offering tools, served by `llm`: in auto mode, the offer's
    grammar (free text, then calls valid against the schemas) when the model writes Hermes
    calls and its engine serves structured output; the other formats stay free."""
    grammar = offer.auto_grammar
    if grammar is None or params.constraint is not None or params.ignore_eos:
        return params
    if not llm.capabilities.structured_output:
        return params
    if tool_format_of(chat_template_of(llm.tokenizer)) is not ToolFormat.HERMES:
        return params
    return msgspec.structs.replace(params, constraint=grammar)


def call_body(call: ParsedCall) -> dict[str, Any]:
    """One entry of `message.tool_calls`."""
    return {
        "id": new_call_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


@dataclass(frozen=True, slots=True)
class ToolCalling:
    """How one request's completions are read for tool calls."""

    parser: ToolParser
    parallel: bool = True  # parallel_tool_calls: false keeps the first call only
    named: bool = False  # tool_choice named a function: finish_reason stays "stop" (OpenAI)
    # the grammar forced calls (required or named): the output is nothing but calls, so text
    # beside the complete ones is an unfinished call cut by max_tokens, never content
    forced: bool = False

    def parse(self, text: str, *, final: bool) -> ParsedOutput:
        parsed = self.parser.parse(text, final=final)
        if not self.parallel:
            parsed.calls = parsed.calls[:1]
        return parsed

    def message(self, text: str) -> dict[str, Any]:
        """The assistant `message` of a whole completion."""
        parsed = self.parse(text, final=True)
        if not parsed.calls:
            return {"role": "assistant", "content": text}
        calls = [call_body(c) for c in parsed.calls]
        content = None if self.forced else parsed.content or None
        return {"role": "assistant", "content": content, "tool_calls": calls}

    def finish_reason(self, reason: str | None, called: bool) -> str | None:
        """ "tool_calls" for a completion that stopped after calling tools (not for a named
        function, as OpenAI)."""
        return "tool_calls" if called and reason == "stop" and not self.named else reason

    def stream(self) -> ToolCallStream:
        return ToolCallStream(self)


@dataclass(slots=True)
class StreamPiece:
    content: str  # delta.content to send ("" for none)
    tool_calls: list[dict[str, Any]]  # delta.tool_calls entries to send, in order


@dataclass(slots=True)
class ToolCallStream:
    """The streaming state of one choice; see the module docstring."""

    calling: ToolCalling
    text: str = ""  # everything generated so far
    sent: int = 0  # text[:sent] went out as content
    start: int | None = None  # where the calls begin
    arguments_sent: list[str] = field(default_factory=list)  # per call sent: its arguments so far
    content_sent: list[str] = field(default_factory=list)

    @property
    def called(self) -> bool:
        return bool(self.arguments_sent)

    def feed(self, delta: str) -> StreamPiece:
        self.text += delta
        parser = self.calling.parser
        if self.start is None:
            self.start = parser.find_start(self.text)
        if self.start is None:
            end = len(self.text) - parser.pending_length(self.text)
            return StreamPiece(self._content_to(end), [])
        content = self._content_to(self.start)
        return StreamPiece(content, self._calls(self.calling.parse(self.text, final=False)))

    def finish(self) -> StreamPiece:
        """What remains once the completion has ended."""
        parsed = self.calling.parse(self.text, final=True)
        if not parsed.calls and not self.called:
            return StreamPiece(self._content_to(len(self.text)), [])
        said = "".join(self.content_sent).strip()
        rest = parsed.content[len(said) :] if parsed.content.startswith(said) else ""
        if self.calling.forced:
            rest = ""
        self.sent = len(self.text)
        return StreamPiece(rest, self._calls(parsed))

    def _content_to(self, end: int) -> str:
        piece = self.text[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        if piece:
            self.content_sent.append(piece)
        return piece

    def _calls(self, parsed: ParsedOutput) -> list[dict[str, Any]]:
        """The entries that bring the client from what was sent to `parsed.calls`: a head per
        new call, then each call's arguments written since."""
        entries: list[dict[str, Any]] = []
        for index, call in enumerate(parsed.calls):
            if index == len(self.arguments_sent):
                body = call_body(call)
                function = {"name": call.name, "arguments": ""}
                entries.append({"index": index, **body, "function": function})
                self.arguments_sent.append("")
            sent = self.arguments_sent[index]
            if len(call.arguments) > len(sent) and call.arguments.startswith(sent):
                fragment = call.arguments[len(sent) :]
                entries.append({"index": index, "function": {"arguments": fragment}})
                self.arguments_sent[index] = call.arguments
        return entries
