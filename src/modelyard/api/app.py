"""`build_app`: the ASGI application, over any ModelProvider.

```python
app = build_app(provider, config, router=None, startup=manager.start)
```

- `provider`: where models come from (`Manager` in `serve`, small fakes in tests);
- `config`: the ModelyardConfig (middleware limits, timeouts, textbook defaults);
- `router`: the gateway's ModelRouter (default: built from config.gateway routes, identity if none);
- `startup`: awaited in the background after the server starts listening (e.g. preloading the
  pinned models); `/ready` answers 503 until it returns, `/health` answers 200 meanwhile;
- `close_provider`: on shutdown (after uvicorn drained in-flight requests) `provider.close()`
  stops every worker.

`app.state` holds `provider`, `router`, `config`, `ready`, `startup_error`, `started_at`, `vllm`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import FastAPI

from modelyard.api.errors import install_exception_handlers
from modelyard.api.lora import LoRARegistry
from modelyard.api.middleware import build_middleware_stack
from modelyard.api.routes import (
    embeddings,
    health,
    kserve,
    lora,
    openai,
    predict,
    textbook,
    vllm_compat,
)
from modelyard.api.routes.vllm_compat import VLLMBackend, make_vllm_backend
from modelyard.config import ModelyardConfig
from modelyard.gateway import admin as gateway_admin
from modelyard.gateway.base import ModelRouter
from modelyard.manager.base import ModelProvider
from modelyard.observability import routes as metrics_routes
from modelyard.observability.collectors import register_provider_stats

log = logging.getLogger(__name__)


def build_app(
    provider: ModelProvider,
    config: ModelyardConfig | None = None,
    *,
    router: ModelRouter | None = None,
    startup: Callable[[], Awaitable[object]] | None = None,
    close_provider: bool = True,
    vllm: VLLMBackend | None = None,
) -> FastAPI:
    """The FastAPI app with every route, the middleware stack and the error handlers."""
    config = config or ModelyardConfig()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_run_startup(app, startup)) if startup else None
        unregister_stats = register_provider_stats(provider)  # engine gauges at /metrics
        try:
            yield
        finally:
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            unregister_stats()
            if close_provider:
                await provider.close()

    app = FastAPI(
        title="modelyard",
        lifespan=lifespan,
        middleware=build_middleware_stack(config),
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.provider = provider
    app.state.router = router or _gateway_router(config)
    app.state.config = config
    app.state.ready = startup is None
    app.state.startup_error = None
    app.state.started_at = time.time()
    app.state.vllm = vllm if vllm is not None else make_vllm_backend(config.server.textbook)
    app.state.loras = LoRARegistry.from_provider(provider)  # LoRA adapters as model ids
    install_exception_handlers(app)
    for module in (health, openai, textbook, vllm_compat, kserve, predict, embeddings, lora):
        app.include_router(module.router)
    app.include_router(gateway_admin.router)
    app.include_router(metrics_routes.router)
    return app


def _gateway_router(config: ModelyardConfig) -> ModelRouter:
    """The router of the config's gateway.routes (identity when none are configured)."""
    from modelyard.gateway.config import GatewayConfig
    from modelyard.gateway.router import build_router

    return build_router(GatewayConfig.from_dict(config.gateway))


async def _run_startup(app: FastAPI, startup: Callable[[], Awaitable[object]]) -> None:
    try:
        await startup()
    except Exception as exc:
        log.exception("startup failed")
        app.state.startup_error = f"{type(exc).__name__}: {exc}"
        return
    app.state.ready = True
    log.info("ready")
