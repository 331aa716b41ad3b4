"""`build_app`: the ASGI application, over any ModelProvider.

```python
app = build_app(provider, config, router=None, startup=manager.start)
```

- `provider`: where models come from (`Manager` in `serve`, small fakes in tests);
- `config`: the ModelyardConfig (middleware limits, timeouts, textbook defaults);
- `router`: the gateway's ModelRouter (default: built from config.gateway routes, identity if none);
- `gateway`: the gateway's parts (default: built from config.gateway), shared by the auth
  middleware and the request path every model route goes through (gateway/request_path.py);
- `startup`: awaited in the background after the server starts listening (e.g. preloading the
  pinned models); `/ready` answers 503 until it returns, `/health` answers 200 meanwhile;
- `close_provider`: on shutdown (after uvicorn drained in-flight requests) `provider.close()`
  stops every worker.

`app.state` holds `provider`, `router`, `request_path`, `config`, `ready`, `startup_error`,
`started_at`, `vllm`, `prefixes` (the pinned prefixes' directory, api/routes/prefixes.py),
`responses` (stored responses of /v1/responses, api/responses_store.py),
`kernels` (the runner's kernels as `startup` found them, a KernelState; None until then).
Every route depends on `admit_request` (one request and one concurrency slot for routes that
run no model; model routes are admitted by the request path after routing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import Depends, FastAPI

from modelyard.api.errors import install_exception_handlers
from modelyard.api.middleware import build_middleware_stack
from modelyard.api.openapi import install_openapi
from modelyard.api.responses_store import ResponseStore
from modelyard.api.routes import (
    embeddings,
    health,
    kserve,
    lora,
    openai,
    predict,
    prefixes,
    responses,
    textbook,
    vllm_compat,
)
from modelyard.api.routes.agent import router as agent_router
from modelyard.api.routes.console import router as console_router
from modelyard.api.routes.vllm_compat import VLLMBackend, make_vllm_backend
from modelyard.config import ModelyardConfig
from modelyard.gateway import admin as gateway_admin
from modelyard.gateway.base import ModelRouter
from modelyard.gateway.gateway import Gateway, build_gateway
from modelyard.gateway.request_path import RequestPath, admit_request, require_admin
from modelyard.gateway.router import build_router
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
    gateway: Gateway | None = None,
) -> FastAPI:
    """The FastAPI app with every route, the middleware stack and the error handlers."""
    config = config or ModelyardConfig()
    gateway = gateway or build_gateway(config.gateway)
    router = router or build_router(gateway.config)

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
        middleware=build_middleware_stack(config, gateway),
        dependencies=[Depends(admit_request)],
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.provider = provider
    app.state.router = router
    app.state.request_path = RequestPath(
        provider, router, timeout_s=config.server.request_timeout_s
    )
    app.state.config = config
    app.state.ready = startup is None
    app.state.startup_error = None
    app.state.kernels = None  # set by `modelyard serve`'s startup (observability/kernels.py)
    app.state.started_at = time.time()
    app.state.vllm = vllm if vllm is not None else make_vllm_backend(config.server.textbook)
    app.state.prefixes = prefixes.PrefixDirectory()
    app.state.responses = ResponseStore(
        config.server.responses_ttl_s, config.server.responses_max_stored
    )
    install_exception_handlers(app)
    routes = (
        health,
        openai,
        responses,
        textbook,
        vllm_compat,
        kserve,
        predict,
        embeddings,
        prefixes,
        lora,
    )
    for module in routes:
        app.include_router(module.router)
    app.include_router(gateway_admin.router)
    # /metrics names tenants: admin scope, unless listed in gateway.open_paths (a scraper)
    app.include_router(metrics_routes.router, dependencies=[Depends(require_admin)])
    app.include_router(console_router)  # the web console at /ui
    app.include_router(agent_router)  # the knowledge agent, for the console's agent box
    install_openapi(app)  # every status each route can answer with, in the document
    return app


async def _run_startup(app: FastAPI, startup: Callable[[], Awaitable[object]]) -> None:
    try:
        await startup()
    except Exception as exc:
        log.exception("startup failed")
        app.state.startup_error = f"{type(exc).__name__}: {exc}"
        return
    app.state.ready = True
    log.info("ready")
