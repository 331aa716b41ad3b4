"""The fakes the tests share, one definition each: engine.py (a scripted engine core behind the
real worker loop and client), llm.py (an LLMClient), models.py (model providers, their lease,
a predictor, a key store). Tests import them as `fakes.<module>` (tests/ is on sys.path)."""
