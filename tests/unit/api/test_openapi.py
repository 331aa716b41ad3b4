"""The OpenAPI document states every status each operation can answer with, and its body."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.unit


async def test_every_operation_documents_its_statuses(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    schemas = document["components"]["schemas"]
    assert "HTTPValidationError" not in schemas  # a validation error is a 400, never a 422
    operations = [
        (method, path, op) for path, ops in document["paths"].items() for method, op in ops.items()
    ]
    assert len(operations) > 20
    for method, path, op in operations:
        responses = op["responses"]
        assert "422" not in responses, (method, path)
        envelope = "KServeError" if path.startswith("/v2") else "OpenAIError"
        for status, response in responses.items():
            schema = response["content"].get("application/json", {}).get("schema", {})
            if status.startswith(("4", "5")) and "$ref" in schema:
                assert schema["$ref"].endswith(envelope), (method, path, status)
        if method == "post":
            assert {"400", "413"} <= set(responses), (method, path)
    chat = document["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"200", "400", "401", "403", "404", "413", "429", "500", "503", "504"} == set(chat)
    assert "text/event-stream" in chat["200"]["content"]
    agent = document["paths"]["/v1/agent/ask"]["post"]["responses"]
    assert {"404", "500", "503", "504", "507"} <= set(agent)  # no index; its calls' statuses
    health = document["paths"]["/health"]["get"]["responses"]
    assert set(health) == {"200"}
    infer = document["paths"]["/v2/models/{name}/infer"]["post"]
    assert infer["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "InferenceRequest"
    )


async def test_documented_error_bodies_match_what_the_server_sends(
    client: httpx.AsyncClient,
) -> None:
    r = await client.post("/v1/chat/completions", json={"model": "m"})
    assert r.status_code == 400
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = await client.post("/v2/models/m/infer", content=b"[" * 100, headers={"x": "y"})
    assert r.status_code == 400
    assert isinstance(r.json()["error"], str)


def test_the_routes_documented_as_running_a_model_are_those_marked_so() -> None:
    """api/openapi.py names them by path; gateway/request_path.py's @runs_model marks them."""
    from fastapi.routing import APIRoute

    from modelyard.api.openapi import _RUNS_A_MODEL
    from modelyard.api.routes import (
        embeddings,
        kserve,
        openai,
        predict,
        prefixes,
        textbook,
        vllm_compat,
    )

    routes = [
        (method.lower(), route)
        for module in (embeddings, kserve, openai, predict, prefixes, textbook, vllm_compat)
        for route in module.router.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    ]
    marked = {
        (m, r.path) for m, r in routes if getattr(r.endpoint, "__modelyard_runs_model__", False)
    }
    documented = {(m, r.path) for m, r in routes if m == "post" and _RUNS_A_MODEL.match(r.path)}
    assert ("post", "/v1/chat/completions") in marked
    assert marked == documented
