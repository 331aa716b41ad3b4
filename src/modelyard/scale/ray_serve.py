"""The catalog as a Ray Serve application: `build_ray_app`, `app_builder`, `serve_on_ray`.

```
HTTP -> Serve proxy -> ingress (the same ASGI app: gateway, OpenAI/textbook/KServe routes,
                        metrics; its provider is scale/provider.RayProvider)
                         |-- llm-<id>: one deployment per catalog LLM; a replica owns one engine
                         |             worker; replicas/autoscaling from the entry's `scaling`;
                         |             picked by the prefix-aware request router
                         '-- pool: the non-LLM models, @serve.multiplexed by model id, each
                                   replica within the manager's byte budget
```

- `modelyard serve --ray [--address ADDR]` joins (or starts) a Ray cluster, starts Serve's HTTP
  proxy on the server's host/port, runs the application and waits for SIGTERM/SIGINT;
- `serve run modelyard.scale.ray_serve:app_builder catalog=FILE config=FILE` and `serve build`
  (then KubeRay's RayService) go through `app_builder`.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Mapping
from typing import Any, cast

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig
from ray.serve.deployment import Deployment

from modelyard.config import ModelyardConfig, load_config
from modelyard.engine.config import CacheConfig
from modelyard.manager.catalog import Catalog, serving_catalog
from modelyard.model_spec import ModelSpec
from modelyard.scale.calls import CALL_CONTEXT, CallContext
from modelyard.scale.config import RayConfig
from modelyard.scale.provider import RayProvider
from modelyard.scale.replicas import LLMServer, ModelPool

ROUTER_CLASS = "modelyard.scale.ray_router.PrefixAwareRequestRouter"
POW2_ROUTER_CLASS = "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter"


class SessionContextMiddleware:
    """Outermost ASGI layer of the ingress: puts the session header and the request id of each
    HTTP request into CALL_CONTEXT for the Ray calls it makes.

    Serve's proxy owns X-Request-ID: it takes the client's (or makes one), propagates it to the
    replicas and sets the response header. The app below gets the same id as its request header
    (so its access log and errors use it) and its own copy of the response header is dropped."""

    def __init__(self, app: Any, session_header: str) -> None:
        self.app = app
        self._session = session_header.lower().encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope.get("headers") or [] if k != b"x-request-id"]
        session = dict(headers).get(self._session)
        request_id = _serve_request_id() or dict(scope.get("headers") or []).get(
            b"x-request-id", b""
        ).decode("latin-1")
        if request_id:
            headers.append((b"x-request-id", request_id.encode("latin-1")))
        context = CallContext(
            session_id=session.decode("latin-1") if session else None,
            request_id=request_id or None,
        )

        async def send_without_request_id(message: Any) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k != b"x-request-id"]
                message = {**message, "headers": kept}
            await send(message)

        token = CALL_CONTEXT.set(context)
        try:
            await self.app({**scope, "headers": headers}, receive, send_without_request_id)
        finally:
            CALL_CONTEXT.reset(token)


def _serve_request_id() -> str | None:
    """The request id Serve's proxy assigned (the client's X-Request-ID when it sent one)."""
    try:
        from ray.serve.context import _get_serve_request_context

        request_id = _get_serve_request_context().request_id
    except Exception:  # outside a Serve request (tests), or a Serve without the context
        return None
    return str(request_id) if request_id else None


class Ingress:
    """The ingress deployment: builds the ASGI app over a RayProvider in each replica."""

    def __init__(
        self,
        config: ModelyardConfig,
        specs: list[ModelSpec],
        llm_handles: dict[str, Any],
        pool: Any,
    ) -> None:
        self._config = config
        self._specs = specs
        self._llm_handles = llm_handles
        self._pool = pool

    def __serve_build_asgi_app__(self) -> Any:
        from modelyard.api.app import build_app

        ray_config = self._config.ray
        provider = RayProvider(Catalog(self._specs), self._llm_handles, self._pool)
        app = build_app(provider, self._config, startup=provider.start)
        return SessionContextMiddleware(app, ray_config.session_header)


def router_config(spec: ModelSpec, ray_config: RayConfig) -> RequestRouterConfig:
    """The request router of an LLM deployment: prefix-aware, or Serve's power of two."""
    if ray_config.router == "pow2":
        return RequestRouterConfig()
    make: Any = RequestRouterConfig  # pydantic: the class may be given as an import path
    config: RequestRouterConfig = make(
        request_router_class=ROUTER_CLASS,
        request_router_kwargs={
            "block_size": spec.llm.cache.block_size if spec.llm else CacheConfig.block_size,
            "max_blocks": ray_config.max_prefix_blocks,
            "table_size": ray_config.prefix_table_size,
            "max_queue_gap": ray_config.max_queue_gap,
        },
    )
    return config


def llm_deployment(spec: ModelSpec, ray_config: RayConfig) -> Deployment:
    """One catalog LLM's deployment; replicas or autoscaling from its `scaling` entry."""
    scaling = spec.scaling
    options: dict[str, Any] = {
        "name": f"llm-{spec.id}",
        "ray_actor_options": {"num_cpus": scaling.num_cpus},
        "max_ongoing_requests": scaling.max_ongoing_requests,
        "health_check_period_s": ray_config.health_check_period_s,
        "graceful_shutdown_timeout_s": ray_config.graceful_shutdown_timeout_s,
        "request_router_config": router_config(spec, ray_config),
    }
    if scaling.max_replicas is None:
        options["num_replicas"] = scaling.num_replicas
    else:
        options["autoscaling_config"] = {
            "min_replicas": scaling.min_replicas,
            "max_replicas": scaling.max_replicas,
            "target_ongoing_requests": scaling.target_ongoing_requests,
            "upscale_delay_s": scaling.upscale_delay_s,
            "downscale_delay_s": scaling.downscale_delay_s,
        }
    return _deployment(LLMServer).options(**options)


def build_ray_app(config: ModelyardConfig, catalog: Catalog) -> Application:
    """The application: ingress -> one deployment per LLM + the multiplexed pool."""
    ray_config = config.ray
    specs = list(catalog)
    llms = {
        spec.id: llm_deployment(spec, ray_config).bind(spec) for spec in specs if spec.kind.is_llm
    }
    others = [spec for spec in specs if not spec.kind.is_llm]
    pool = None
    if others:
        pool = (
            _deployment(ModelPool)
            .options(
                name="pool",
                num_replicas=ray_config.pool_replicas,
                ray_actor_options={"num_cpus": ray_config.pool_num_cpus},
                health_check_period_s=ray_config.health_check_period_s,
            )
            .bind(others, config.manager, ray_config.pool_max_models)
        )
    ingress = _deployment(serve.ingress()(Ingress)).options(
        name="ingress",
        num_replicas=ray_config.ingress_replicas,
        ray_actor_options={"num_cpus": ray_config.ingress_num_cpus},
    )
    app: Application = ingress.bind(config, specs, llms, pool)
    return app


def _deployment(cls: type) -> Deployment:
    return cast(Deployment, serve.deployment(cls))


def app_builder(args: Mapping[str, str]) -> Application:
    """For `serve run` / `serve build`: `catalog=FILE config=FILE` (both optional)."""

    config = load_config(args.get("config"))
    catalog = serving_catalog(
        args.get("catalog") or config.catalog, config.engine.overrides(), preload=True
    )
    return build_ray_app(config, catalog)


def serve_on_ray(config: ModelyardConfig, catalog: Catalog, *, address: str | None) -> int:
    """Run the application on a Ray cluster until SIGTERM/SIGINT; then delete it (and stop
    Serve too when this process started it and no other application is left)."""
    import ray

    ray_config = config.ray
    if address is None:  # a new local cluster, on loopback
        ray.init(include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    else:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        started_serve = not _serve_running()
        if not started_serve:
            print("Serve already runs on this cluster: its HTTP host and port stay", flush=True)
        serve.start(http_options={"host": config.server.host, "port": config.server.port})
        serve.run(
            build_ray_app(config, catalog),
            name=ray_config.app_name,
            route_prefix="/",
            blocking=False,
        )
        url = f"http://{config.server.host}:{config.server.port}"
        print(f"modelyard on Ray Serve: {url} (ready: {url}/ready)", flush=True)
        stop.wait()
        serve.delete(ray_config.app_name)
        if started_serve and not serve.status().applications:
            serve.shutdown()  # type: ignore[no-untyped-call]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        ray.shutdown()
    print("modelyard stopped", flush=True)
    return 0


def _serve_running() -> bool:
    """Whether Serve's controller already runs on the cluster."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    try:
        ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    except ValueError:
        return False
    return True
