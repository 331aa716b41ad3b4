"""Tool calling on the chat API: request fields (definitions), the forcing grammar (enforce),
one parser per call format (hermes, llama3, mistral, chosen by `parsing.parser_for`), and the
streamed `delta.tool_calls` (parsing.ToolCallStream)."""
