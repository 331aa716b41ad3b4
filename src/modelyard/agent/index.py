"""`VectorIndex`: chunks and their embeddings, searchable by cosine similarity, on disk.

The vectors live in a FAISS index (`faiss-cpu`, Meta's similarity-search library: exact
`IndexFlatIP` search over L2-normalised vectors, i.e. cosine similarity, wrapped in
`IndexIDMap2` so ids are ours); the chunk texts and the settings that made them live beside it
in JSON. A folder holds one index:

    index.faiss   faiss.write_index of the vectors (ids = positions in chunks.json)
    chunks.json   {"embedding_model", "dim", "chunks": [{"chunk_id", "source", "text"}...]}

faiss is an optional dependency (`pip install 'modelyard[agent]'`): the server never needs it.
Exact flat search is the right kind for a knowledge folder of up to some 10^5 chunks; FAISS's
IVF/HNSW indexes are a one-line change when a folder outgrows it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from modelyard.agent.chunking import Chunk

INDEX_FILE = "index.faiss"
CHUNKS_FILE = "chunks.json"


def _faiss() -> Any:
    try:
        import faiss
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            "the knowledge agent needs faiss-cpu: pip install 'modelyard[agent]'"
        ) from exc
    return faiss


@dataclass(frozen=True, slots=True)
class Hit:
    chunk: Chunk
    score: float  # cosine similarity, -1..1


class VectorIndex:
    """Chunks + an exact cosine index over their embeddings (see the module docstring)."""

    def __init__(self, embedding_model: str, dim: int) -> None:
        faiss = _faiss()
        self.embedding_model = embedding_model
        self.dim = dim
        self.chunks: list[Chunk] = []
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))

    def __len__(self) -> int:
        return len(self.chunks)

    def add(self, chunks: list[Chunk], vectors: npt.NDArray[np.float32]) -> None:
        """Add chunks with their embeddings ((len(chunks), dim), normalised here)."""
        if vectors.shape != (len(chunks), self.dim):
            raise ValueError(f"vectors must be ({len(chunks)}, {self.dim}), got {vectors.shape}")
        ids = np.arange(len(self.chunks), len(self.chunks) + len(chunks), dtype=np.int64)
        self._index.add_with_ids(_normalised(vectors), ids)
        self.chunks.extend(chunks)

    def search(self, vectors: npt.NDArray[np.float32], k: int) -> list[list[Hit]]:
        """The k most similar chunks for each query vector, most similar first."""
        if not self.chunks:
            return [[] for _ in range(len(vectors))]
        scores, ids = self._index.search(_normalised(vectors), min(k, len(self.chunks)))
        return [
            [
                Hit(self.chunks[int(i)], float(s))
                for s, i in zip(row_s, row_i, strict=True)
                if i >= 0
            ]
            for row_s, row_i in zip(scores, ids, strict=True)
        ]

    def save(self, folder: Path) -> None:
        """Write both files (each atomically: a temporary file, then rename)."""
        folder.mkdir(parents=True, exist_ok=True)
        meta = {
            "embedding_model": self.embedding_model,
            "dim": self.dim,
            "chunks": [
                {"chunk_id": c.chunk_id, "source": c.source, "text": c.text} for c in self.chunks
            ],
        }
        tmp_index = folder / (INDEX_FILE + ".tmp")
        _faiss().write_index(self._index, str(tmp_index))
        os.replace(tmp_index, folder / INDEX_FILE)
        tmp_chunks = folder / (CHUNKS_FILE + ".tmp")
        tmp_chunks.write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")
        os.replace(tmp_chunks, folder / CHUNKS_FILE)

    @classmethod
    def load(cls, folder: Path) -> VectorIndex:
        """Read an index written by `save`. FileNotFoundError when the folder has none."""
        meta = json.loads((folder / CHUNKS_FILE).read_text(encoding="utf-8"))
        index = cls(str(meta["embedding_model"]), int(meta["dim"]))
        index._index = _faiss().read_index(str(folder / INDEX_FILE))
        index.chunks = [Chunk(c["chunk_id"], c["source"], c["text"]) for c in meta["chunks"]]
        if index._index.ntotal != len(index.chunks):
            raise ValueError(
                f"{folder}: {index._index.ntotal} vectors for {len(index.chunks)} chunks"
            )
        return index

    @staticmethod
    def exists(folder: Path) -> bool:
        return (folder / INDEX_FILE).is_file() and (folder / CHUNKS_FILE).is_file()


def _normalised(vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    out = np.ascontiguousarray(vectors, dtype=np.float32).copy()
    _faiss().normalize_L2(out)
    return out
