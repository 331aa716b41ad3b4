"""What one question to the knowledge agent gives back: the answer and its trace (every model
call with its timings, the chunks retrieved, the searches the model made), and its JSON shape
(the CLI's `--json`, `POST /v1/agent/ask`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from modelyard.agent.api import ChatResult
from modelyard.agent.index import Hit
from modelyard.agent.search_tool import Search

Mode = Literal["none", "rag", "cag"]
MODES: tuple[Mode, ...] = ("none", "rag", "cag")


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One call the agent made to the server."""

    step: str  # plan | search | retrieve | answer | refine
    seconds: float  # client-side wall time of the call
    chat: ChatResult | None = None  # for chat calls: text, TTFT, token counts


@dataclass(slots=True)
class Answer:
    """The result of one `ask`."""

    question: str
    mode: Mode
    text: str  # the final answer (the refined one when refine is on)
    draft: str = ""  # the answer call's text
    query: str = ""  # RAG: the planned search query (tools: the model's first query)
    # RAG: the retrieved chunks, cited as [1], [2]... in this order (prompt: best first;
    # tools: in the order the searches found them)
    hits: list[Hit] = field(default_factory=list)
    retrieval: str = ""  # RAG: how it retrieved, "tools" or "prompt"
    searches: list[Search] = field(default_factory=list)  # RAG with tools: the model's calls
    calls: list[ModelCall] = field(default_factory=list)
    e2e_s: float = 0.0  # the whole loop, client-side

    @property
    def model_calls(self) -> int:
        return len(self.calls)

    def as_json(self, *, chunk_text: bool) -> dict[str, Any]:
        """The answer as JSON (the CLI's --json, POST /v1/agent/ask): chunks with their text
        and source when `chunk_text`, else only their ids."""
        return {
            "question": self.question,
            "mode": self.mode,
            "answer": self.text,
            "draft": self.draft,
            "query": self.query,
            "retrieval": self.retrieval or None,
            "searches": [s.as_json() for s in self.searches],
            "chunks": [
                {
                    **(asdict(h.chunk) if chunk_text else {"id": h.chunk.chunk_id}),
                    "score": round(h.score, 4),
                }
                for h in self.hits
            ],
            "calls": [
                {
                    "step": c.step,
                    "seconds": round(c.seconds, 4),
                    "ttft_s": round(c.chat.ttft_s, 4) if c.chat else None,
                    "prompt_tokens": c.chat.prompt_tokens if c.chat else None,
                    "cached_tokens": c.chat.cached_tokens if c.chat else None,
                }
                for c in self.calls
            ],
            "e2e_s": round(self.e2e_s, 4),
        }

    @property
    def searched(self) -> bool:
        """Whether any of the model's search calls ran (RAG with tools)."""
        return any(not search.error for search in self.searches)

    def cite(self, hit: Hit) -> int:
        """The hit's citation number (its 1-based place in `hits`), adding it when new."""
        for number, seen in enumerate(self.hits, start=1):
            if seen.chunk.chunk_id == hit.chunk.chunk_id:
                return number
        self.hits.append(hit)
        return len(self.hits)

    @property
    def answer_call(self) -> ChatResult:
        """The answer step's chat call (its TTFT is the time to the first answer token)."""
        return next(c.chat for c in self.calls if c.step == "answer" and c.chat is not None)
