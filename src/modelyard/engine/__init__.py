"""The LLM engine: scheduler, KV cache manager, engine core loop, and its async client."""
