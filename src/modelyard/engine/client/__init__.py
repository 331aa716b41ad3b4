"""The engine's API-process side: `AsyncLLM` and the worker client, output processing
(detokenization, stop strings), the `LLMClient` protocol route handlers use, and the directory
of pinned prefixes. It never imports the worker side (engine/core): the wire messages are what
the two share."""
