"""One helper that turns a request's RequestOutputs into the LLM Prometheus metrics.

Every LLM route feeds each output to `RequestTracker.observe` and calls `record` once at the end
(finished, aborted or failed), so TTFT, inter-token latency, end-to-end latency, queue time,
token counters and `request_success` mean the same thing on every route.
"""

from __future__ import annotations

import time

from modelyard.engine.client.protocol import RequestOutput
from modelyard.observability import metrics as m


class RequestTracker:
    """Metrics of one engine request (all of its n completions)."""

    def __init__(self, model: str, tenant: str) -> None:
        self.model = model  # model id that served the request (metric label)
        self.tenant = tenant  # tenant (metric label)
        self.last: RequestOutput | None = None  # the latest output seen
        self.finish_reasons: dict[int, str] = {}  # completion index -> finish reason
        self._last_token_at: float | None = None
        self._recorded = False
        self._itl = m.INTER_TOKEN_LATENCY.labels(model)  # observed per update: look it up once

    def observe(self, output: RequestOutput) -> None:
        """Feed every output, in order."""
        self.last = output
        if any(delta.token_ids for delta in output.deltas):
            now = time.time()
            if self._last_token_at is not None:
                self._itl.observe(now - self._last_token_at)
            self._last_token_at = now
        for delta in output.deltas:
            if delta.finish_reason is not None:
                self.finish_reasons[delta.index] = str(delta.finish_reason)

    @property
    def prompt_tokens(self) -> int:
        return self.last.num_prompt_tokens if self.last else 0

    @property
    def completion_tokens(self) -> int:
        return self.last.num_generated_tokens if self.last else 0

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache."""
        return self.last.num_cached_tokens if self.last else 0

    def record(self, *, aborted: bool = False) -> None:
        """Record the request once; `aborted` when it ended before finishing."""
        if self._recorded:
            return
        self._recorded = True
        last = self.last
        reasons = list(self.finish_reasons.values()) or (["abort"] if aborted else [])
        for reason in reasons:
            m.REQUEST_SUCCESS.labels(self.model, reason).inc()
        if last is None:
            return
        m.PROMPT_TOKENS.labels(self.model, self.tenant).inc(last.num_prompt_tokens)
        m.GENERATION_TOKENS.labels(self.model, self.tenant).inc(last.num_generated_tokens)
        metrics = last.metrics
        if metrics.arrival_time <= 0:
            return  # no timings reported
        if metrics.ttft is not None:
            m.TIME_TO_FIRST_TOKEN.labels(self.model, self.tenant).observe(metrics.ttft)
        if metrics.queue_time is not None:
            m.REQUEST_QUEUE_TIME.labels(self.model).observe(metrics.queue_time)
        end = metrics.finished_time or time.time()
        m.E2E_REQUEST_LATENCY.labels(self.model, self.tenant).observe(end - metrics.arrival_time)
        first, lastt = metrics.first_token_time, metrics.last_token_time
        if first is not None and lastt is not None and last.num_generated_tokens > 1:
            per_token = (lastt - first) / (last.num_generated_tokens - 1)
            m.TIME_PER_OUTPUT_TOKEN.labels(self.model).observe(per_token)

    def timings(self) -> dict[str, float | int | None]:
        """The documented `modelyard` field of responses: seconds and token counts."""
        last = self.last
        if last is None:
            return {}
        metrics = last.metrics
        e2e = None
        if metrics.arrival_time > 0:
            e2e = (metrics.finished_time or time.time()) - metrics.arrival_time
        return {
            "queue_time": _round(metrics.queue_time),
            "ttft": _round(metrics.ttft),
            "e2e": _round(e2e),
            "prompt_tokens": last.num_prompt_tokens,
            "cached_tokens": last.num_cached_tokens,
            "completion_tokens": last.num_generated_tokens,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
