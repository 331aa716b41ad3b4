"""Tool calling on the chat API: request fields (definitions), the grammars of forced and
auto-mode calls (enforce), one parser per call format (hermes, llama3, mistral, chosen by
`parsing.parser_for`) over a JSON-aware call scanner (scan), and the streamed
`delta.tool_calls` (parsing.ToolCallStream)."""
