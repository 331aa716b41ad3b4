"""The knowledge agent: RAG and CAG over a folder of documents, as a client of modelyard's own
HTTP API (`/v1/embeddings`, `/v1/chat/completions` with or without tools, `/v1/prefixes`). See
agent/agent.py.

Needs the optional `agent` extra (faiss-cpu) for its vector index.
"""

from modelyard.agent.agent import AgentConfig, KnowledgeAgent
from modelyard.agent.answer import MODES, Answer, Mode, ModelCall
from modelyard.agent.api import ChatResult, ModelyardAPI, ModelyardAPIError, ToolCall
from modelyard.agent.chunking import Chunk, Document, chunk_documents, load_documents
from modelyard.agent.index import Hit, VectorIndex
from modelyard.agent.search_tool import RETRIEVALS, Retrieval, Search

__all__ = [
    "MODES",
    "RETRIEVALS",
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
    "Retrieval",
    "Search",
    "ToolCall",
    "VectorIndex",
    "chunk_documents",
    "load_documents",
]
