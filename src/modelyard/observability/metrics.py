"""Prometheus metrics, named after vLLM's so existing dashboards fit, prefixed `modelyard:`.

Metric objects live here at module level (the prometheus-client default registry) and are
imported by the component that observes them. Tests compare values before and after, so they
never depend on global state left by other tests.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Latency buckets fine enough for sub-100 ms targets.
_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_REQUEST_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
    120.0,
)
_LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

P = "modelyard:"

# ------------------------------------------------------------------ LLM requests (per model)
TIME_TO_FIRST_TOKEN = Histogram(
    P + "time_to_first_token_seconds",
    "Time to first token.",
    ["model", "tenant"],
    buckets=_LATENCY_BUCKETS,
)
INTER_TOKEN_LATENCY = Histogram(
    P + "inter_token_latency_seconds",
    "Time between consecutive output tokens.",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
TIME_PER_OUTPUT_TOKEN = Histogram(
    P + "request_time_per_output_token_seconds",
    "Decode time per output token per request.",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
E2E_REQUEST_LATENCY = Histogram(
    P + "e2e_request_latency_seconds",
    "End-to-end request latency.",
    ["model", "tenant"],
    buckets=_REQUEST_BUCKETS,
)
REQUEST_QUEUE_TIME = Histogram(
    P + "request_queue_time_seconds",
    "Time a request waited before first scheduled.",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
PROMPT_TOKENS = Counter(P + "prompt_tokens", "Prompt tokens processed.", ["model", "tenant"])
GENERATION_TOKENS = Counter(P + "generation_tokens", "Generated tokens.", ["model", "tenant"])
REQUEST_SUCCESS = Counter(
    P + "request_success", "Finished requests by reason.", ["model", "finished_reason"]
)

# ------------------------------------------------------------------ engine state (per model)
NUM_REQUESTS_RUNNING = Gauge(P + "num_requests_running", "Requests running.", ["model"])
NUM_REQUESTS_WAITING = Gauge(P + "num_requests_waiting", "Requests waiting.", ["model"])
KV_CACHE_USAGE = Gauge(P + "kv_cache_usage_perc", "KV cache usage (0-1).", ["model"])
PREFIX_CACHE_QUERIES = Counter(
    P + "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", ["model"]
)
PREFIX_CACHE_HITS = Counter(
    P + "prefix_cache_hits", "Prompt tokens found in the prefix cache.", ["model"]
)
NUM_PREEMPTIONS = Counter(P + "num_preemptions", "Preemptions.", ["model"])
ENGINE_FAILED_REQUESTS = Counter(
    P + "engine_failed_requests",
    "Requests that made an engine step fail (failed alone; their batch-mates went on).",
    ["model"],
)
PINNED_PREFIX_BLOCKS = Gauge(
    P + "pinned_prefix_blocks", "KV blocks held by pinned prefixes (never evicted).", ["model"]
)
PINNED_PREFIXES = Gauge(P + "pinned_prefixes", "Live pinned prefixes.", ["model"])
PINNED_PREFIX_HITS = Counter(
    P + "pinned_prefix_hits", "Requests that reused the blocks of a pinned prefix.", ["model"]
)
LORA_RESIDENT_ADAPTERS = Gauge(
    P + "lora_resident_adapters", "LoRA adapters loaded in the engine's memory.", ["model"]
)
LORA_RESIDENT_BYTES = Gauge(
    P + "lora_resident_bytes", "Memory of the loaded LoRA adapters (and their slots).", ["model"]
)
LORA_LOADS = Counter(P + "lora_loads", "LoRA adapters read from disk.", ["model"])
LORA_LOAD_SECONDS = Counter(
    P + "lora_load_seconds", "Time spent reading LoRA adapters and packing slots.", ["model"]
)
STRUCTURED_REQUESTS = Counter(
    P + "structured_requests", "Requests with an output constraint (structured output).", ["model"]
)
STRUCTURED_COMPILE_SECONDS = Counter(
    P + "structured_compile_seconds", "Time spent compiling output grammars.", ["model"]
)
STRUCTURED_MASK_SECONDS = Counter(
    P + "structured_mask_seconds", "Time spent computing grammar token masks.", ["model"]
)
STRUCTURED_MASK_STEPS = Counter(
    P + "structured_mask_steps", "Engine steps with at least one constrained row.", ["model"]
)
SPEC_DECODE_NUM_DRAFTS = Counter(
    P + "spec_decode_num_drafts", "Speculative verifications of >= 1 token.", ["model", "method"]
)
SPEC_DECODE_NUM_DRAFT_TOKENS = Counter(
    P + "spec_decode_num_draft_tokens", "Proposed (draft) tokens.", ["model", "method"]
)
SPEC_DECODE_NUM_ACCEPTED_TOKENS = Counter(
    P + "spec_decode_num_accepted_tokens", "Proposed tokens accepted.", ["model", "method"]
)
SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS = Counter(
    P + "spec_decode_num_accepted_tokens_per_pos",
    "Proposed tokens accepted, per draft position.",
    ["model", "method", "position"],
)

# ------------------------------------------------------------------ model manager
MODEL_LOAD_LATENCY = Histogram(
    P + "model_load_seconds", "Model load latency.", ["model"], buckets=_LOAD_BUCKETS
)
MODEL_LOADS = Counter(P + "model_loads", "Model loads.", ["model"])
MODEL_EVICTIONS = Counter(P + "model_evictions", "Model evictions.", ["model", "reason"])
MODEL_LOAD_FAILURES = Counter(P + "model_load_failures", "Failed model loads.", ["model"])
MODEL_CACHE_HITS = Counter(P + "model_cache_hits", "Leases of an already loaded model.", ["model"])
MODEL_CACHE_MISSES = Counter(P + "model_cache_misses", "Leases that needed a load.", ["model"])
MODEL_LOADED_BYTES = Gauge(P + "model_loaded_bytes", "Measured memory of loaded models.", ["model"])
MODEL_BUDGET_BYTES = Gauge(P + "model_budget_bytes", "Memory budget of the manager.")
MODEL_ACTIVE_LEASES = Gauge(P + "model_active_leases", "Leases in use.", ["model"])

# ------------------------------------------------------------------ non-LLM inference
INFERENCE_REQUEST_DURATION = Histogram(
    P + "inference_request_duration_seconds",
    "Non-LLM request duration (end to end).",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
INFERENCE_QUEUE_DURATION = Histogram(
    P + "inference_queue_duration_seconds",
    "Time in the dynamic batcher's queue.",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
INFERENCE_COMPUTE_DURATION = Histogram(
    P + "inference_compute_duration_seconds",
    "Backend compute time per batch.",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)
INFERENCE_BATCH_SIZE = Histogram(
    P + "inference_batch_size", "Items per backend call.", ["model"], buckets=_BATCH_BUCKETS
)
INFERENCE_REQUESTS = Counter(
    P + "inference_requests", "Non-LLM requests by outcome.", ["model", "outcome"]
)

# ------------------------------------------------------------------ HTTP and gateway
HTTP_REQUESTS = Counter(
    P + "http_requests", "HTTP requests.", ["route", "method", "status", "tenant"]
)
HTTP_REQUEST_DURATION = Histogram(
    P + "http_request_duration_seconds",
    "HTTP request duration.",
    ["route", "method"],
    buckets=_REQUEST_BUCKETS,
)
RATE_LIMIT_REJECTIONS = Counter(
    P + "rate_limit_rejections", "Requests rejected by a limit.", ["tenant", "limit"]
)
RATE_LIMIT_STORE_ERRORS = Counter(
    P + "rate_limit_store_errors", "Rate-limit store failures (e.g. Redis down).", ["policy"]
)
ROUTE_DECISIONS = Counter(
    P + "route_decisions", "Routing decisions.", ["requested", "target", "reason"]
)
TENANT_REQUESTS = Counter(P + "tenant_requests", "Requests per tenant.", ["tenant"])
TENANT_MODEL_REQUESTS = Counter(
    P + "tenant_model_requests",
    "Requests served per tenant, serving model and routing policy.",
    ["tenant", "model", "policy"],
)
TENANT_ITEMS = Counter(
    P + "tenant_items", "Inputs served to non-LLM models per tenant.", ["tenant", "model"]
)
TENANT_INPUT_BYTES = Counter(
    P + "tenant_input_bytes",
    "Request body bytes of served requests per tenant.",
    ["tenant", "model"],
)

# ------------------------------------------------------------------ the runner's kernels
KERNELS_INFO = Gauge(
    P + "kernels_info",
    'The native kernels\' instruction-set kind in use (1 on one series; kind="none": the slower '
    "pure-torch path).",
    ["kind"],
)
