"""A fake OpenAI-compatible server with scripted timings (run by uvicorn in its own process).

The model name picks the behaviour:
- `scripted`: first token after TTFT_S, then one token every ITL_S, `max_tokens` tokens in all,
  usage in the last chunk when asked (stream_options.include_usage);
- `fail`: HTTP 500;  `hang`: sleeps longer than any client timeout used in the tests;
- `broken`: a stream that stops without `[DONE]`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

TTFT_S = 0.08
ITL_S = 0.02


def make_fake_openai() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Any:
        body = await request.json()
        model = body["model"]
        if model == "fail":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        if model == "hang":
            await asyncio.sleep(5)
        n = int(body.get("max_tokens", 8))
        usage = bool((body.get("stream_options") or {}).get("include_usage"))

        async def events() -> AsyncIterator[bytes]:
            await asyncio.sleep(TTFT_S)
            for i in range(n):
                if i:
                    await asyncio.sleep(ITL_S)
                chunk = {"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            if model == "broken":
                return
            if usage:
                u = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
                yield f"data: {json.dumps({'choices': [], 'usage': u})}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app
