"""Observability: Prometheus metrics, HTTP middleware, `/metrics`, structured logs.

Nothing is imported here on purpose: worker processes import `observability.metrics` and must not
pull in FastAPI. Public names, by module:
- `metrics`: the metric objects (module level, default registry);
- `http`: `MetricsMiddleware`, `observability_middleware()`;
- `logging`: `configure_logging`, `AccessLogMiddleware`, `REQUEST_ID_SCOPE_KEY`;
- `routes`: `router` (`GET /metrics`);
- `collectors`: `register_engine_stats_source`, `register_provider_stats`, `refresh_engine_metrics`.
"""
