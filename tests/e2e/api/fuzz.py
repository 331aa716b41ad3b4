"""The fuzzing layer's driver: schemathesis generates requests from a running server's own
OpenAPI document and checks every answer:

- no 5xx, except the documented 503 of /generate_vllm when vLLM is not enabled;
- the status is one the document lists for the operation;
- the content type and the body match what the document says for that status.

Each operation gets `examples` positive and `examples` negative (schema-violating) requests,
derandomized (the same requests every run) and never shrunk, so the time is bounded. Half of
the generated requests get a real model name in their `model` / `model_id` / path `name`, so
that they get past the model lookup and into the handlers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import schemathesis
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@dataclass
class FuzzReport:
    requests: int = 0
    statuses: dict[int, int] = field(default_factory=dict)  # status -> count
    failures: list[str] = field(default_factory=list)  # "<operation>: <what failed>"
    seconds: float = 0.0


@dataclass(frozen=True)
class Targets:
    """Real names the fuzzer may put in a request."""

    llm: str  # for `model` fields
    models: tuple[str, ...]  # non-LLM models for `model_id` and /v2 paths


def fuzz(url: str, headers: dict[str, str], targets: Targets, examples: int) -> FuzzReport:
    """Run every operation of the server's document (see the module docstring)."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=headers, timeout=30)
    report = FuzzReport()
    start = time.monotonic()
    for result in schema.get_all_operations():
        operation = result.ok()
        modes = [GenerationMode.POSITIVE]
        if operation.body or any(True for _ in operation.iter_parameters()):
            modes.append(GenerationMode.NEGATIVE)  # something to break
        for mode in modes:
            _fuzz_operation(operation, mode, url, headers, targets, examples, report)
    report.seconds = time.monotonic() - start
    return report


def _fuzz_operation(
    operation: Any,
    mode: GenerationMode,
    url: str,
    headers: dict[str, str],
    targets: Targets,
    examples: int,
    report: FuzzReport,
) -> None:
    @hypothesis.settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
        suppress_health_check=list(hypothesis.HealthCheck),
        report_multiple_bugs=False,
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode), aim=st.booleans())
    def run(case: Any, aim: bool) -> None:
        if aim:
            _aim_at_real_models(case, targets)
        response = case.call(base_url=url, headers=headers, timeout=120)
        report.requests += 1
        report.statuses[response.status_code] = report.statuses.get(response.status_code, 0) + 1
        if _documented_vllm_503(operation.path, response):
            return
        case.validate_response(response, checks=CHECKS, headers=headers)

    try:
        run()
    except hypothesis.errors.Unsatisfiable:
        pass  # no schema-violating request exists (e.g. only path strings to break)
    except (Exception, BaseExceptionGroup) as exc:  # a check failed: report them all at the end
        report.failures.append(f"{operation.method.upper()} {operation.path} ({mode}): {exc}")


def _aim_at_real_models(case: Any, targets: Targets) -> None:
    body = case.body
    if isinstance(body, dict):
        if "model" in body:
            body["model"] = targets.llm
        if "model_id" in body:
            body["model_id"] = targets.models[0]
    path = case.path_parameters
    if isinstance(path, dict) and "name" in path and "/repository/" not in case.operation.path:
        path["name"] = targets.models[len(str(path["name"])) % len(targets.models)]
    query = case.query
    if isinstance(query, dict) and "model" in query:
        query["model"] = targets.llm


def _documented_vllm_503(path: str, response: Any) -> bool:
    if path != "/generate_vllm" or response.status_code != 503:
        return False
    error = response.json()["error"]
    return bool(error["code"] == "vllm_not_enabled")
