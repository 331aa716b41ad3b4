"""`modelyard agent`: ingest a knowledge folder, then ask questions with RAG, CAG or neither.

    modelyard agent ingest docs/ [--index DIR]
    modelyard agent ask "How are models evicted?" [--mode rag|cag|none] [--json]
        [--retrieval auto|tools|prompt]        # RAG: the model searches through a tool, or not
    modelyard agent unpin                      # release the CAG knowledge pin

Every model call goes to a modelyard server (`--url`, default http://127.0.0.1:8000; `--api-key`
or MODELYARD_API_KEY when the gateway's auth is on).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

DEFAULT_INDEX = "~/.modelyard/agent/default"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="modelyard server")
    parser.add_argument("--api-key", default=os.environ.get("MODELYARD_API_KEY"))
    parser.add_argument("--index", default=DEFAULT_INDEX, help="index folder (default %(default)s)")
    parser.add_argument("--chat-model", default="smollm2")
    parser.add_argument("--embedding-model", default="all-minilm-l6-v2")
    actions = parser.add_subparsers(dest="action", required=True)
    ingest = actions.add_parser("ingest", help="chunk, embed and index a folder of .md/.txt")
    ingest.add_argument("folder", type=Path)
    ingest.add_argument("--chunk-words", type=int, default=120)
    ingest.add_argument("--overlap-words", type=int, default=30)
    ask = actions.add_parser("ask", help="answer a question from the indexed knowledge")
    ask.add_argument("question")
    ask.add_argument("--mode", choices=["rag", "cag", "none"], default="rag")
    ask.add_argument(
        "--retrieval",
        choices=["auto", "tools", "prompt"],
        default="auto",
        help="RAG: the model calls a search tool (tools), the agent puts the passages in the "
        "prompt (prompt), or tools where the chat model supports them (auto, the default)",
    )
    ask.add_argument("--max-tool-rounds", type=int, default=2, help="RAG with tools: 1..5")
    ask.add_argument("--top-k", type=int, default=4)
    ask.add_argument("--max-tokens", type=int, default=64)
    ask.add_argument("--no-plan", action="store_true", help="RAG: retrieve with the question")
    ask.add_argument("--no-refine", action="store_true", help="keep the first answer")
    ask.add_argument("--json", action="store_true", help="print the answer and calls as JSON")
    actions.add_parser("unpin", help="release the CAG knowledge pin")


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args, Path(args.index).expanduser()))


async def _run(args: argparse.Namespace, index_dir: Path) -> int:
    from modelyard.agent import AgentConfig, KnowledgeAgent, ModelyardAPI

    config = AgentConfig(
        chat_model=args.chat_model,
        embedding_model=args.embedding_model,
        chunk_words=getattr(args, "chunk_words", 120),
        overlap_words=getattr(args, "overlap_words", 30),
        top_k=getattr(args, "top_k", 4),
        max_tokens=getattr(args, "max_tokens", 64),
        plan=not getattr(args, "no_plan", False),
        refine=not getattr(args, "no_refine", False),
        retrieval=getattr(args, "retrieval", "auto"),
        max_tool_rounds=getattr(args, "max_tool_rounds", 2),
    )
    api = ModelyardAPI(args.url, api_key=args.api_key)
    agent = KnowledgeAgent(api, index_dir, config)
    try:
        if args.action == "ingest":
            index = await agent.ingest(args.folder)
            print(f"indexed {len(index)} chunks of {args.folder} into {agent.index_dir}")
        elif args.action == "unpin":
            print("released" if await agent.unpin_knowledge() else "no pin")
        else:
            answer = await agent.ask(args.question, mode=args.mode)
            shown = answer.as_json(chunk_text=False) if args.json else None
            print(answer.text if shown is None else json.dumps(shown, indent=1))
    finally:
        await api.aclose()
    return 0
