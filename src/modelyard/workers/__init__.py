"""What runs inside a non-LLM model's worker process: the entry point (`main.worker_main`), the
dynamic batcher, and the wire messages it exchanges with the API process."""
