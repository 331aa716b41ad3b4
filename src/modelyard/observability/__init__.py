"""Observability: Prometheus metrics, HTTP middleware, `/metrics`, structured logs.

Nothing is imported here on purpose: worker processes import `observability.metrics` and must not
pull in FastAPI. Public names, by module:
- `metrics`: the metric objects (module level, default registry);
- `http`: `MetricsMiddleware`;
- `logging`: `configure_logging`, `AccessLogMiddleware`;
- `request_id`: `RequestIdMiddleware`, `request_id_of`;
- `llm_metrics`: `RequestTracker` (the LLM request metrics every route records);
- `routes`: `router` (`GET /metrics`);
- `collectors`: `register_engine_stats_source`, `register_provider_stats`, `refresh_engine_metrics`.
"""
