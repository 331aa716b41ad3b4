"""`KnowledgeAgent`: answers questions about a folder of documents, over modelyard's HTTP API.

```python
api = ModelyardAPI("http://127.0.0.1:8000")
agent = KnowledgeAgent(api, Path("~/.modelyard/agent/docs").expanduser())
await agent.ingest(Path("docs/"))            # chunk, embed, write the FAISS index
answer = await agent.ask("How are models evicted?", mode="rag")
print(answer.text, [h.chunk.chunk_id for h in answer.hits], answer.model_calls)
```

Modes (`ask(question, mode=...)`), each a fixed loop of model calls:

- `"none"`: answer from the model alone (1 chat call): the baseline.
- `"rag"` (retrieval-augmented), retrieving in one of two ways (`AgentConfig.retrieval`;
  `"auto"`, the default, takes tools where the chat model's `capabilities` say `tools`;
  search_tool.py decides):
  - **tools**: the model is offered the function `search_knowledge(query)`. **search** (a
    chat call, the first forced to be a call: `tool_choice: "required"`), **retrieve** (one
    embeddings call for the calls' queries and the question; each call's top-k chunks go back
    to the model as a `role: "tool"` message), then the model answers from them
    (tool_choice `"auto"`) or searches again, at most `max_tool_rounds` searching turns; if it
    has not answered by then, an **answer** call (tool_choice `"none"`) answers from the tool
    messages. **refine** as below. 2-4 chat calls, 1-2 embeddings calls; `Answer.searches`
    records the queries the model wrote and what they found.
  - **prompt**: **plan** (a chat call turns the question into a search query), **retrieve**
    (one embeddings call for the question and the query; the top-k chunks by cosine
    similarity, the better score of the two per chunk), **answer** (a chat call with the
    chunks as context), **refine** (a chat call that checks the draft against the same context
    and rewrites it). 3 chat calls + 1 embeddings call.
- `"cag"` (cache-augmented): the whole knowledge, as a system message, is pinned once in the
  chat model's KV cache (`POST /v1/prefixes`, re-pinned if it expired); **answer** and
  **refine** are chat calls that name the pin (`prefix_id`), so the server prefills only the
  question. 2 chat calls.

`plan` and `refine` can be switched off (`AgentConfig`), leaving the single-call RAG / CAG
the benchmark also measures (`plan` is the prompt retrieval's; with tools the model writes the
query). Every call is recorded with its timings (`Answer.calls`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from modelyard.agent.answer import MODES, Answer, Mode, ModelCall
from modelyard.agent.api import ChatResult, ModelyardAPI, ModelyardAPIError, ToolCall
from modelyard.agent.chunking import chunk_documents, load_documents
from modelyard.agent.index import Hit, VectorIndex
from modelyard.agent.search_tool import (
    RETRIEVALS,
    TOOL_RULES,
    FirstChoice,
    Retrieval,
    Search,
    assistant_message,
    choose_first_tool_choice,
    parse_search,
    search_tool,
    tool_message,
)

CAG_FILE = "cag.json"  # the index folder's record of the knowledge pin
SEARCH_MAX_TOKENS = 96  # the forced search turn: room for a call with the longest query
MAX_CALLS_PER_TURN = 4  # search calls run per turn; further ones are answered with an error

ANSWER_RULES = (
    "You answer questions about modelyard, a model-serving system. Use only the knowledge "
    "given. Answer in one or two short sentences. If the knowledge does not say, answer: "
    "I don't know."
)
PLAN_PROMPT = (
    "Rewrite the question as a short search query of a few keywords. Reply with the query only."
)
REFINE_PROMPT = (
    "Question: {question}\nDraft answer: {draft}\n\nCheck the draft against the knowledge. "
    "Reply with the corrected answer only, in one or two short sentences."
)


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    chat_model: str = "smollm2"  # a chat model of the server (id or alias)
    embedding_model: str = "all-minilm-l6-v2"  # an embedding model of the server
    top_k: int = 4  # chunks given to the answer call (RAG)
    chunk_words: int = 120  # chunk size when ingesting
    overlap_words: int = 30  # words each chunk repeats from the one before
    max_tokens: int = 64  # per answer / refine call
    plan: bool = True  # RAG: turn the question into a search query first
    refine: bool = True  # RAG and CAG: check and rewrite the draft answer
    pin_ttl_s: float = 3600.0  # CAG: TTL of the knowledge pin
    retrieval: Retrieval = "auto"  # RAG: tools | prompt | auto (tools where the model has them)
    max_tool_rounds: int = 2  # RAG with tools: searching turns before the answer (1..5)

    def __post_init__(self) -> None:
        if self.top_k < 1 or self.max_tokens < 1:
            raise ValueError("top_k and max_tokens must be >= 1")
        if self.retrieval not in RETRIEVALS:
            raise ValueError(f"retrieval must be one of {list(RETRIEVALS)}")
        if not 1 <= self.max_tool_rounds <= 5:
            raise ValueError("max_tool_rounds must be 1..5")


class KnowledgeAgent:
    """RAG and CAG over one knowledge folder's index (see the module docstring)."""

    def __init__(
        self, api: ModelyardAPI, index_dir: Path, config: AgentConfig | None = None
    ) -> None:
        self.api = api
        self.index_dir = index_dir
        self.config = config or AgentConfig()
        self._index: VectorIndex | None = None
        self._knowledge: str | None = None
        self._first_choice: FirstChoice | None = None  # the tools loop's; None: prompt
        self._first_choice_known = False  # the capabilities are asked once

    # ------------------------------------------------------------------ ingest

    async def ingest(self, folder: Path) -> VectorIndex:
        """Chunk every text/markdown file of `folder`, embed the chunks, write the index (and
        the knowledge text for CAG) into `index_dir`, replacing what was there."""
        cfg = self.config
        documents = await asyncio.to_thread(load_documents, folder)
        chunks = chunk_documents(
            documents, size_words=cfg.chunk_words, overlap_words=cfg.overlap_words
        )
        vectors = []
        for start in range(0, len(chunks), 32):
            batch = [c.text for c in chunks[start : start + 32]]
            vectors.append(await self.api.embed(batch, model=cfg.embedding_model))
        matrix = np.concatenate(vectors)
        index = VectorIndex(cfg.embedding_model, int(matrix.shape[1]))
        index.add(chunks, matrix)
        knowledge = "\n\n".join(f"# {d.name}\n{d.text.strip()}" for d in documents)
        await asyncio.to_thread(self._write, index, knowledge)
        self._index, self._knowledge = index, knowledge
        return index

    def _write(self, index: VectorIndex, knowledge: str) -> None:
        index.save(self.index_dir)
        (self.index_dir / "knowledge.md").write_text(knowledge, encoding="utf-8")
        (self.index_dir / CAG_FILE).unlink(missing_ok=True)

    async def index(self) -> VectorIndex:
        """The index in `index_dir` (read once)."""
        if self._index is None:
            self._index = await asyncio.to_thread(self._load_index)
        return self._index

    def _load_index(self) -> VectorIndex:
        if not VectorIndex.exists(self.index_dir):
            raise FileNotFoundError(f"no index in {self.index_dir}: ingest a folder first")
        return VectorIndex.load(self.index_dir)

    async def knowledge(self) -> str:
        """The whole knowledge as one text (what CAG pins)."""
        if self._knowledge is None:
            path = self.index_dir / "knowledge.md"
            self._knowledge = await asyncio.to_thread(path.read_text, encoding="utf-8")
        return self._knowledge

    # ------------------------------------------------------------------ retrieve

    async def retrieve(self, queries: list[str], k: int) -> list[Hit]:
        """Top-k chunks for any of the queries (one embeddings call), best score first."""
        return _best(await self._search(queries, k), k)

    async def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Each query's top-k chunks (one embeddings call for all)."""
        index = await self.index()
        vectors = await self.api.embed(queries, model=index.embedding_model)
        return index.search(vectors, k)

    # ------------------------------------------------------------------ ask

    async def ask(self, question: str, mode: Mode = "rag") -> Answer:
        """Answer one question with the mode's loop (see the module docstring)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        start = time.perf_counter()
        answer = Answer(question=question, mode=mode, text="")
        if mode == "none":
            draft = await self._chat(answer, "answer", _messages(ANSWER_RULES, question))
            answer.text = answer.draft = draft.text.strip()
        elif mode == "rag":
            await self._ask_rag(answer)
        else:
            await self._ask_cag(answer)
        answer.e2e_s = time.perf_counter() - start
        return answer

    async def _ask_rag(self, answer: Answer) -> None:
        first = await self._first_tool_choice()
        if first is None:
            await self._ask_rag_prompt(answer)
        else:
            await self._ask_rag_tools(answer, first)

    async def _first_tool_choice(self) -> FirstChoice | None:
        """The tools loop's first tool_choice, None for prompt retrieval (search_tool.py), from
        the chat model's capabilities (asked once; a server without the listings: unknown)."""
        if not self._first_choice_known:
            capabilities = None
            if self.config.retrieval != "prompt":
                try:
                    capabilities = await self.api.capabilities(self.config.chat_model)
                except ModelyardAPIError:
                    capabilities = None
            self._first_choice = choose_first_tool_choice(self.config.retrieval, capabilities)
            self._first_choice_known = True
        return self._first_choice

    async def _ask_rag_prompt(self, answer: Answer) -> None:
        cfg = self.config
        answer.retrieval = "prompt"
        queries = [answer.question]
        if cfg.plan:
            plan = await self._chat(answer, "plan", _messages(PLAN_PROMPT, answer.question), 24)
            answer.query = plan.text.strip().splitlines()[0] if plan.text.strip() else ""
            if answer.query:
                queries.append(answer.query)
        t0 = time.perf_counter()
        answer.hits = await self.retrieve(queries, cfg.top_k)
        answer.calls.append(ModelCall("retrieve", time.perf_counter() - t0))
        await self._answer_from_hits(answer)

    async def _answer_from_hits(self, answer: Answer) -> None:
        """Answer (unless the tools loop already did) and refine, with `answer.hits` as the
        numbered knowledge in the system message."""
        context = "\n\n".join(f"[{i + 1}] {h.chunk.text}" for i, h in enumerate(answer.hits))
        system = f"{ANSWER_RULES}\n\nKnowledge:\n{context}"
        if not answer.draft:
            draft = await self._chat(answer, "answer", _messages(system, answer.question))
            answer.text = answer.draft = draft.text.strip()
        if self.config.refine:
            prompt = REFINE_PROMPT.format(question=answer.question, draft=answer.draft)
            refined = await self._chat(answer, "refine", _messages(system, prompt))
            answer.text = refined.text.strip() or answer.draft

    async def _ask_rag_tools(self, answer: Answer, first: FirstChoice) -> None:
        """The tools loop (module docstring): searching turns, then the answer."""
        answer.retrieval = "tools"
        tools = [search_tool()]
        messages: list[dict[str, Any]] = _messages(TOOL_RULES, answer.question)
        for turn_number in range(self.config.max_tool_rounds):
            choice = first if turn_number == 0 else "auto"
            budget = SEARCH_MAX_TOKENS if choice == "required" else None
            turn = await self._chat(answer, "search", messages, budget, tools=tools, choice=choice)
            if not turn.tool_calls:
                if answer.searched:  # the model answered from the passages it found
                    answer.calls[-1] = replace(answer.calls[-1], step="answer")
                    answer.text = answer.draft = turn.text.strip()
                break
            messages.append(assistant_message(turn))
            messages += await self._run_searches(answer, turn.tool_calls)
        if not answer.searched:  # no search ran (an unforced model, bad calls): retrieve
            answer.text = answer.draft = ""
            await self._ask_rag_prompt(answer)
            return
        if not answer.draft:  # still searching, or no text: answer from the tool messages
            final = await self._chat(answer, "answer", messages, tools=tools, choice="none")
            answer.text = answer.draft = final.text.strip()
        await self._answer_from_hits(answer)

    async def _run_searches(self, answer: Answer, calls: tuple[ToolCall, ...]) -> list[Any]:
        """Run one turn's calls (one embeddings call for all), record them in the answer, and
        return the `role: "tool"` message answering each. A call's passages are the top-k for
        its query or the question, the better score of the two per chunk (as the prompt
        retrieval does with its planned query): a poor query of a small model still finds
        what the question does."""
        searches = [parse_search(call, self.config.top_k) for call in calls]
        for i in range(MAX_CALLS_PER_TURN, len(searches)):
            searches[i] = Search(calls[i].call_id, "", 0, error="too many calls in one turn")
        runnable = [i for i, search in enumerate(searches) if not search.error]
        found: dict[int, list[Hit]] = {}  # a runnable search's position -> its passages
        if runnable:
            t0 = time.perf_counter()
            queries = [searches[i].query for i in runnable] + [answer.question]
            *rows, by_question = await self._search(queries, self.config.top_k)
            answer.calls.append(ModelCall("retrieve", time.perf_counter() - t0))
            for i, row in zip(runnable, rows, strict=True):
                found[i] = _best([row, by_question], self.config.top_k)
            answer.query = answer.query or searches[runnable[0]].query
        messages = []
        for i, search in enumerate(searches):
            hits = found.get(i, [])
            done = replace(search, chunk_ids=tuple(h.chunk.chunk_id for h in hits))
            answer.searches.append(done)
            passages = [(answer.cite(hit), hit.chunk.text) for hit in hits]
            messages.append(tool_message(done, passages))
        return messages

    async def _ask_cag(self, answer: Answer) -> None:
        prefix_id = await self.pin_knowledge()
        user = [{"role": "user", "content": answer.question}]
        draft = await self._chat(answer, "answer", user, prefix_id=prefix_id)
        answer.text = answer.draft = draft.text.strip()
        if self.config.refine:
            prompt = REFINE_PROMPT.format(question=answer.question, draft=answer.draft)
            refine = [{"role": "user", "content": prompt}]
            refined = await self._chat(answer, "refine", refine, prefix_id=prefix_id)
            answer.text = refined.text.strip() or answer.draft

    async def _chat(
        self,
        answer: Answer,
        step: str,
        messages: list[dict[str, Any]],
        max_tokens: int | None = None,
        prefix_id: str | None = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        choice: str | None = None,
    ) -> ChatResult:
        result = await self.api.chat(
            messages,
            model=self.config.chat_model,
            max_tokens=max_tokens or self.config.max_tokens,
            prefix_id=prefix_id,
            tools=tools,
            tool_choice=choice,
        )
        answer.calls.append(ModelCall(step, result.e2e_s, result))
        return result

    # ------------------------------------------------------------------ CAG pin

    def cag_system_message(self, knowledge: str) -> str:
        return f"{ANSWER_RULES}\n\nKnowledge:\n{knowledge}"

    async def pin_knowledge(self) -> str:
        """The id of the knowledge pin, pinning it (again) when there is none live."""
        prefix_id = await asyncio.to_thread(self._read_pin)
        if prefix_id is not None and await self.api.get_prefix(prefix_id) is not None:
            return prefix_id
        system = self.cag_system_message(await self.knowledge())
        pinned = await self.api.pin_prefix(
            model=self.config.chat_model,
            messages=[{"role": "system", "content": system}],
            ttl_s=self.config.pin_ttl_s,
        )
        prefix_id = str(pinned["id"])
        await asyncio.to_thread(self._write_pin, prefix_id)
        return prefix_id

    async def unpin_knowledge(self) -> bool:
        """Release the knowledge pin, if there is one."""
        prefix_id = await asyncio.to_thread(self._read_pin)
        if prefix_id is None:
            return False
        await asyncio.to_thread(self._write_pin, None)
        return await self.api.delete_prefix(prefix_id)

    def _read_pin(self) -> str | None:
        record = self.index_dir / CAG_FILE
        if not record.is_file():
            return None
        return str(json.loads(record.read_text(encoding="utf-8"))["prefix_id"])

    def _write_pin(self, prefix_id: str | None) -> None:
        record = self.index_dir / CAG_FILE
        if prefix_id is None:
            record.unlink(missing_ok=True)
        else:
            record.write_text(json.dumps({"prefix_id": prefix_id}), encoding="utf-8")


def _messages(system: str, user: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _best(rows: list[list[Hit]], k: int) -> list[Hit]:
    """The top-k chunks of several result lists, each with its best score, best first."""
    best: dict[str, Hit] = {}
    for hits in rows:
        for hit in hits:
            seen = best.get(hit.chunk.chunk_id)
            if seen is None or hit.score > seen.score:
                best[hit.chunk.chunk_id] = hit
    return sorted(best.values(), key=lambda h: -h.score)[:k]
