"""The knowledge agent: RAG and CAG over a folder of documents, as a client of modelyard's own
HTTP API (`/v1/embeddings`, `/v1/chat/completions`, `/v1/prefixes`). See agent/agent.py.

Needs the optional `agent` extra (faiss-cpu) for its vector index.
"""

from modelyard.agent.agent import MODES, AgentConfig, Answer, KnowledgeAgent, Mode, ModelCall
from modelyard.agent.api import ChatResult, ModelyardAPI, ModelyardAPIError
from modelyard.agent.chunking import Chunk, Document, chunk_documents, load_documents
from modelyard.agent.index import Hit, VectorIndex

__all__ = [
    "MODES",
    "AgentConfig",
    "Answer",
    "ChatResult",
    "Chunk",
    "Document",
    "Hit",
    "KnowledgeAgent",
    "Mode",
    "ModelCall",
    "ModelyardAPI",
    "ModelyardAPIError",
    "VectorIndex",
    "chunk_documents",
    "load_documents",
]
