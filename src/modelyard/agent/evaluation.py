"""The agent's evaluation set: knowledge pages, questions, and how answers are scored.

An evaluation folder holds `knowledge/` (the pages to ingest) and `questions.json`:
`{"questions": [{"id", "question", "source", "evidence", "answers"}...]}`. `evidence` is a
verbatim phrase of the source page: a retrieved chunk answers the question when it contains
the whole phrase (so labels do not depend on the chunking settings). `answers` are strings of
which one must appear in a correct answer (case-insensitive): a coarse, honest check of
answer quality, not a grader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from modelyard.agent.chunking import Chunk
from modelyard.agent.index import Hit


@dataclass(frozen=True, slots=True)
class Question:
    question_id: int
    question: str
    source: str  # the page that answers it
    evidence: str  # a verbatim phrase of that page
    answers: tuple[str, ...]  # one of these in the answer counts it as correct


def load_questions(folder: Path) -> list[Question]:
    data = json.loads((folder / "questions.json").read_text(encoding="utf-8"))
    return [
        Question(q["id"], q["question"], q["source"], q["evidence"], tuple(q["answers"]))
        for q in data["questions"]
    ]


def _squash(text: str) -> str:
    return " ".join(text.split()).lower()


def answers_question(chunk: Chunk, question: Question) -> bool:
    """The chunk is from the question's page and holds its whole evidence phrase."""
    return chunk.source == question.source and _squash(question.evidence) in _squash(chunk.text)


def hit_at(hits: list[Hit], question: Question, k: int) -> bool:
    """Any of the first k retrieved chunks answers the question."""
    return any(answers_question(h.chunk, question) for h in hits[:k])


def answer_correct(text: str, question: Question) -> bool:
    lowered = text.lower()
    return any(a.lower() in lowered for a in question.answers)
