"""Documents in, overlapping chunks out.

A knowledge folder's `.md`, `.markdown` and `.txt` files are read in name order. Each file is
split into paragraphs (blank lines); paragraphs are packed into chunks of about `size_words`
words, and each chunk starts with the last `overlap_words` words of the one before it, so a
fact that straddles a boundary is whole in at least one chunk (a chunk holds at most
`size_words + overlap_words` words). A paragraph longer than a chunk is cut by words. Chunk
ids are `<file>#<n>`, stable for a given folder and settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SUFFIXES = (".md", ".markdown", ".txt")


@dataclass(frozen=True, slots=True)
class Document:
    name: str  # path relative to the folder, "/"-separated
    text: str


@dataclass(frozen=True, slots=True)
class Chunk:
    chunk_id: str  # "<document name>#<index>"
    source: str  # the document's name
    text: str


def load_documents(folder: Path) -> list[Document]:
    """Every text/markdown file under `folder`, in name order. ValueError when there is none."""
    paths = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
    documents = [
        Document(p.relative_to(folder).as_posix(), p.read_text(encoding="utf-8")) for p in paths
    ]
    if not documents:
        raise ValueError(f"no {', '.join(SUFFIXES)} files under {folder}")
    return documents


def chunk_document(document: Document, *, size_words: int, overlap_words: int) -> list[Chunk]:
    """Overlapping chunks of one document (see the module docstring)."""
    if size_words < 1 or not 0 <= overlap_words < size_words:
        raise ValueError("need size_words >= 1 and 0 <= overlap_words < size_words")
    pieces: list[list[str]] = []
    for paragraph in document.text.split("\n\n"):
        words = paragraph.split()
        for start in range(0, len(words), size_words):
            pieces.append(words[start : start + size_words])
    chunks: list[list[str]] = []
    current: list[str] = []
    fresh = 0  # words of `current` that are not the overlap carried from the chunk before
    for piece in pieces:
        if fresh and len(current) + len(piece) > size_words:
            chunks.append(current)
            current = current[len(current) - overlap_words :] if overlap_words else []
            fresh = 0
        current = current + piece
        fresh += len(piece)
    if fresh:
        chunks.append(current)
    return [
        Chunk(f"{document.name}#{i}", document.name, " ".join(words))
        for i, words in enumerate(chunks)
    ]


def chunk_documents(
    documents: list[Document], *, size_words: int = 120, overlap_words: int = 30
) -> list[Chunk]:
    return [
        chunk
        for document in documents
        for chunk in chunk_document(document, size_words=size_words, overlap_words=overlap_words)
    ]
