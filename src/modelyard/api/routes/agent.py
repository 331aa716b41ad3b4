"""`POST /v1/agent/ask`: the knowledge agent (modelyard/agent) answers one question, for the
web console's agent box.

The agent is a client of the HTTP API and stays one here. Each question runs the agent's own
loop (agent/agent.py: search through a tool or plan, retrieve, answer, refine; or CAG's pinned
knowledge) in a worker
thread with its own event loop, so its index reads and FAISS searches never touch the server's
loop. Every model call it makes comes back to this server on its loopback address with the
caller's credentials: authenticated, authorized, routed, admitted and counted as the caller's
own requests.

- body `{"question", "mode": "rag" | "cag" | "none" (default "rag"), "top_k"?: 1..20,
  "model"?: a chat model, "retrieval"?: "auto" | "tools" | "prompt" (default the config's)}`;
- answer `{"question", "mode", "answer", "draft", "query", "retrieval", "searches": [{"call_id",
  "query", "k", "chunks", "error"}], "chunks": [{"chunk_id", "source", "text", "score"}],
  "calls": [{"step", "seconds", "ttft_s"}], "e2e_s"}`;
- the index is the folder `modelyard agent ingest` wrote: the config's `agent.index` (default
  the CLI's `~/.modelyard/agent/default`); the agent's settings are the rest of the `agent:`
  section (config.AgentServerConfig). No index yet: 404 naming the command that makes one;
  faiss-cpu (the `agent` extra) missing: 503; one of the agent's calls refused (401, 403,
  429...): that status, in the OpenAI envelope like every error here.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from modelyard.agent import (
    AgentConfig,
    KnowledgeAgent,
    ModelyardAPI,
    ModelyardAPIError,
    VectorIndex,
)
from modelyard.api.errors import APIError
from modelyard.config import AgentServerConfig

router = APIRouter()


class AskRequest(BaseModel):
    """POST /v1/agent/ask."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, max_length=4000)
    mode: Literal["rag", "cag", "none"] = "rag"
    top_k: int = Field(default=4, ge=1, le=20)  # chunks given to the answer (RAG)
    model: str | None = Field(default=None, min_length=1)  # the chat model; None: the config's
    retrieval: Literal["auto", "tools", "prompt"] | None = None  # RAG; None: the config's


@router.post("/v1/agent/ask")
async def ask(body: AskRequest, request: Request) -> dict[str, Any]:
    config: AgentServerConfig = request.app.state.config.agent
    index = await asyncio.to_thread(_existing_index, config.index)
    if index is None:
        raise APIError(404, "no agent index yet: run `modelyard agent ingest FOLDER` first")
    settings = dataclasses.replace(config.settings, top_k=body.top_k)
    if body.model is not None:
        settings = dataclasses.replace(settings, chat_model=body.model)
    if body.retrieval is not None:
        settings = dataclasses.replace(settings, retrieval=body.retrieval)
    agent_loop = _ask(_loopback_url(request), _credential(request), index, settings, body)
    try:
        return await asyncio.to_thread(asyncio.run, agent_loop)
    except ModelyardAPIError as exc:  # one of the agent's own calls was refused
        raise APIError(exc.status, f"the agent's call failed: {exc}") from exc
    except RuntimeError as exc:  # e.g. faiss-cpu missing (the `agent` extra)
        raise APIError(503, f"the knowledge agent cannot run: {exc}") from exc


async def _ask(
    base_url: str, api_key: str | None, index: Path, settings: AgentConfig, body: AskRequest
) -> dict[str, Any]:
    """The agent's loop for one question (in its own event loop, in a worker thread)."""
    api = ModelyardAPI(base_url, api_key=api_key)
    try:
        answer = await KnowledgeAgent(api, index, settings).ask(body.question, mode=body.mode)
    finally:
        await api.aclose()
    return answer.as_json(chunk_text=True)


def _existing_index(folder: str) -> Path | None:
    path = Path(folder).expanduser()
    return path if VectorIndex.exists(path) else None


def _loopback_url(request: Request) -> str:
    """This server as the agent reaches it: the address it listens on, a wildcard bind read as
    the loopback interface."""
    host, port = request.scope.get("server") or ("127.0.0.1", 8000)
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _credential(request: Request) -> str | None:
    """The caller's API key or token, passed on to the agent's own calls."""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip() or None
    return request.headers.get("x-api-key") or None
