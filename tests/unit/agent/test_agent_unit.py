"""The knowledge agent against a fake modelyard (httpx.MockTransport): chunking, the FAISS
index, the RAG / CAG loops and the calls they make."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from agent_fakes import FakeServer

from modelyard.agent import AgentConfig, KnowledgeAgent, VectorIndex
from modelyard.agent.chunking import Chunk, Document, chunk_document, load_documents
from modelyard.agent.evaluation import Question, answer_correct, hit_at, load_questions
from modelyard.agent.index import Hit
from modelyard.cli import build_parser

pytestmark = pytest.mark.unit

EVAL = Path(__file__).parents[3] / "benchmarks" / "agent_eval"


# ---------------------------------------------------------------- chunking


def test_chunks_overlap_and_keep_every_word() -> None:
    text = "\n\n".join(" ".join(f"p{p}w{i}" for i in range(25)) for p in range(4))
    chunks = chunk_document(Document("d.md", text), size_words=40, overlap_words=10)
    assert [c.chunk_id for c in chunks] == ["d.md#0", "d.md#1", "d.md#2", "d.md#3"]
    words = [c.text.split() for c in chunks]
    for before, after in itertools.pairwise(words):
        assert after[:10] == before[-10:]  # the overlap
        assert len(after) <= 40 + 10
    seen = {w for ws in words for w in ws}
    assert seen == set(text.split())


def test_a_long_paragraph_is_cut_by_words() -> None:
    text = " ".join(f"w{i}" for i in range(100))
    chunks = chunk_document(Document("d.md", text), size_words=30, overlap_words=5)
    assert all(len(c.text.split()) <= 35 for c in chunks)
    assert chunks[-1].text.split()[-1] == "w99"
    with pytest.raises(ValueError, match="overlap"):
        chunk_document(Document("d.md", text), size_words=10, overlap_words=10)


def test_load_documents_reads_text_and_markdown_in_order(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("bee")
    (tmp_path / "a.md").write_text("ay")
    (tmp_path / "c.png").write_bytes(b"\x89PNG")
    assert [d.name for d in load_documents(tmp_path)] == ["a.md", "b.txt"]
    with pytest.raises(ValueError, match=r"no \.md"):
        load_documents(tmp_path / "empty")


# ---------------------------------------------------------------- index


def test_index_searches_by_cosine_and_survives_a_round_trip(tmp_path: Path) -> None:
    chunks = [Chunk(f"d#{i}", "d", f"text {i}") for i in range(3)]
    vectors = np.array([[1, 0, 0], [0.7, 0.7, 0], [0, 0, 5]], dtype=np.float32)
    index = VectorIndex("emb", 3)
    index.add(chunks, vectors)
    hits = index.search(np.array([[1, 0.1, 0]], dtype=np.float32), 2)[0]
    assert [h.chunk.chunk_id for h in hits] == ["d#0", "d#1"]
    assert hits[0].score == pytest.approx(1 / np.sqrt(1.01), rel=1e-5)
    index.save(tmp_path)
    loaded = VectorIndex.load(tmp_path)
    again = loaded.search(np.array([[0, 0, 1]], dtype=np.float32), 1)[0]
    assert (again[0].chunk, again[0].score) == (chunks[2], pytest.approx(1.0))
    assert loaded.embedding_model == "emb"
    with pytest.raises(ValueError, match="vectors must be"):
        index.add(chunks[:1], vectors)


# ---------------------------------------------------------------- the loops


async def test_ingest_and_retrieve_find_the_chunk_with_the_answer(
    agent: KnowledgeAgent, server: FakeServer
) -> None:
    index = await agent.ingest(EVAL / "knowledge")
    assert len(index) > 8
    assert VectorIndex.exists(agent.index_dir)
    assert (agent.index_dir / "knowledge.md").read_text().count("# ") >= 4
    question = load_questions(EVAL)[29]  # "... refuses a pin ... status code"
    hits = await agent.retrieve([question.question], 3)
    assert hit_at(hits, question, 3)


async def test_rag_plans_retrieves_answers_and_refines(
    agent: KnowledgeAgent, server: FakeServer
) -> None:
    await agent.ingest(EVAL / "knowledge")
    server.embedded.clear()
    answer = await agent.ask("Which status refuses a pin over the budget?", mode="rag")
    assert [c.step for c in answer.calls] == ["plan", "retrieve", "answer", "refine"]
    assert answer.model_calls == 4
    assert (answer.query, answer.draft, answer.text) == (
        "pinned prefix budget",
        "draft answer",
        "refined answer",
    )
    assert server.embedded == [[answer.question, "pinned prefix budget"]]  # one call, 2 queries
    assert len(answer.hits) == 3
    answer_system = server.chats[1]["messages"][0]["content"]
    assert answer.hits[0].chunk.text in answer_system
    assert "prefix_id" not in server.chats[1]


async def test_cag_pins_once_and_names_the_pin(agent: KnowledgeAgent, server: FakeServer) -> None:
    await agent.ingest(EVAL / "knowledge")
    first = await agent.ask("What is the default TTL of a pin?", mode="cag")
    second = await agent.ask("How many tokens does a block hold?", mode="cag")
    assert server.pin_posts == 1
    pinned_system = server.pins["pfx-1"]["messages"][0]["content"]
    assert "The KV cache is split into blocks of 16 tokens" in pinned_system
    assert [c.step for c in first.calls] == ["answer", "refine"]
    assert all(chat["prefix_id"] == "pfx-1" for chat in server.chats)
    assert all(len(chat["messages"]) == 1 for chat in server.chats)  # the question only
    assert second.answer_call.cached_tokens == 96
    server.pins.clear()  # the pin expired on the server: the agent pins again
    await agent.ask("Again?", mode="cag")
    assert server.pin_posts == 2
    assert await agent.unpin_knowledge()
    assert server.pins == {}


async def test_no_context_is_one_call_and_switches_work(
    agent: KnowledgeAgent, server: FakeServer, tmp_path: Path
) -> None:
    answer = await agent.ask("Anything?", mode="none")
    assert (answer.model_calls, answer.text) == (1, "draft answer")
    with pytest.raises(ValueError, match="mode"):
        await agent.ask("?", mode="bad")  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="ingest"):
        await agent.ask("?", mode="rag")
    lean = KnowledgeAgent(agent.api, agent.index_dir, AgentConfig(plan=False, refine=False))
    await lean.ingest(EVAL / "knowledge")
    answer = await lean.ask("Which header shows the route?", mode="rag")
    assert [c.step for c in answer.calls] == ["retrieve", "answer"]


# ---------------------------------------------------------------- evaluation, CLI


def test_evaluation_set_is_complete_and_scored_by_evidence() -> None:
    questions = load_questions(EVAL)
    assert len(questions) >= 30
    q = Question(1, "?", "a.md", "blocks of  16 tokens", ("16",))
    good = Hit(Chunk("a.md#0", "a.md", "split into blocks of 16\ntokens."), 0.9)
    other = Hit(Chunk("b.md#0", "b.md", "blocks of 16 tokens"), 0.8)
    assert not hit_at([other, good], q, 1)
    assert hit_at([other, good], q, 2)
    assert answer_correct("It holds 16 tokens.", q)
    assert not answer_correct("It holds many.", q)


def test_cli_parses_the_agent_subcommands() -> None:
    parser = build_parser("agent")
    args = parser.parse_args(["agent", "--url", "http://h:1", "ask", "why?", "--mode", "cag"])
    assert (args.url, args.action, args.question, args.mode) == ("http://h:1", "ask", "why?", "cag")
    args = parser.parse_args(["agent", "ingest", "docs"])
    assert args.folder == Path("docs")
