"""LoRA in the worker: a PEFT folder read and checked against the base model (adapter.py), the
loaded adapters in their slots and the per-row deltas of a step (manager.py), and the hooks that
put those deltas on a Llama layer's projections (hooks.py). The API side is api/lora.py."""
