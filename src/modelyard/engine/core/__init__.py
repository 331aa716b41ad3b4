"""The engine's worker-process side: the core step (schedule, execute, update), the scheduler,
the KV cache and its pinned prefixes, the speculation policy, and the worker entry that builds
the model runner. It never imports the API side (engine/client); it may import `runner/`."""
