"""`modelyard serve`: the HTTP server on a catalog of models.

Runs uvicorn programmatically in this process (the API process never runs a model: the manager
starts one worker process per loaded model). Startup: print the URL and an example request,
start listening at once (`/health` 200, `/ready` 503), preload the catalog's preload/pinned
models with a progress spinner, then report ready. SIGTERM/SIGINT: stop accepting, let
in-flight requests finish for up to `server.drain_timeout_s`, stop the workers, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from modelyard.config import EngineDefaults, ModelyardConfig, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model_path",
        nargs="?",
        default=None,
        metavar="PATH_OR_GGUF",
        help="serve this one LLM (a HF folder or a .gguf file) instead of a catalog",
    )
    parser.add_argument("--model", default=None, help="the same as PATH_OR_GGUF")
    parser.add_argument(
        "--served-model-name", default=None, help="the id of that model (default: its stem)"
    )
    parser.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="TCP port (default 8000)")
    parser.add_argument("--catalog", default=None, help="catalog YAML (default: embedded)")
    parser.add_argument("--config", default=None, help="YAML: server/engine/manager/gateway")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    parser.add_argument("--max-num-seqs", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--kv-cache-bytes", type=int, default=None)
    parser.add_argument(
        "--preload",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="load the catalog's preload models at start (default: yes)",
    )
    parser.add_argument(
        "--lora-root",
        default=None,
        help="POST /v1/load_lora_adapter accepts only adapter folders under this one",
    )
    parser.add_argument("--log-level", default="info", help="uvicorn log level")
    parser.add_argument(
        "--ray",
        action="store_true",
        help="serve the catalog as a Ray Serve application (needs the `ray` extra)",
    )
    parser.add_argument(
        "--address", default=None, help="with --ray: the Ray cluster to join (default: start one)"
    )
    parser.add_argument(
        "--allow-insecure",
        action="store_true",
        help="allow a non-loopback --host with authentication off (warns)",
    )


def config_from_args(args: argparse.Namespace) -> ModelyardConfig:
    """The config file with the command-line options applied on top (ValueError if invalid)."""
    config = load_config(args.config)
    server = config.server
    if args.host is not None:
        server = dataclasses.replace(server, host=args.host)
    if args.port is not None:
        server = dataclasses.replace(server, port=args.port)
    if args.lora_root is not None:
        server = dataclasses.replace(server, lora_root=args.lora_root)
    overrides = {
        "dtype": args.dtype,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "kv_cache_bytes": args.kv_cache_bytes,
    }
    engine = dataclasses.replace(
        config.engine, **{k: v for k, v in overrides.items() if v is not None}
    )
    catalog = args.catalog if args.catalog is not None else config.catalog
    model, name = _single_model(args, config)
    if model is not None and catalog is not None:
        raise ValueError("give either a model path or a catalog, not both")
    return dataclasses.replace(
        config, server=server, engine=engine, catalog=catalog, model=model, served_model_name=name
    )


def _single_model(
    args: argparse.Namespace, config: ModelyardConfig
) -> tuple[str | None, str | None]:
    """The model path of the command line (PATH_OR_GGUF or --model) or the file, and its name."""
    given = [m for m in (getattr(args, "model_path", None), getattr(args, "model", None)) if m]
    if len(set(given)) > 1:
        raise ValueError(f"two model paths given: {given[0]} and {given[1]}")
    model = given[0] if given else config.model
    name = getattr(args, "served_model_name", None) or config.served_model_name
    return model, name


def build_catalog(
    path: str | None,
    engine: EngineDefaults,
    *,
    preload: bool,
    model: str | None = None,
    served_model_name: str | None = None,
) -> Any:
    """The catalog with engine overrides applied to every LLM (and preload cleared if asked);
    with `model`, a catalog of that one LLM (manager.catalog.single_model_catalog)."""
    from modelyard.manager.catalog import serving_catalog, single_model_catalog

    if model is not None:
        return single_model_catalog(
            model, engine.overrides(), name=served_model_name, preload=preload
        )
    return serving_catalog(path, engine.overrides(), preload=preload)


def _catalog_of(config: ModelyardConfig, *, preload: bool) -> Any:
    return build_catalog(
        config.catalog,
        config.engine,
        preload=preload,
        model=config.model,
        served_model_name=config.served_model_name,
    )


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
        _check_exposure(config, allow_insecure=getattr(args, "allow_insecure", False))
        if getattr(args, "ray", False):
            return _serve_on_ray(config, args)
        return serve(config, preload=args.preload, log_level=args.log_level)
    except (ValueError, OSError) as exc:
        print(f"modelyard serve: {exc}", file=sys.stderr)
        return 2


def _serve_on_ray(config: ModelyardConfig, args: argparse.Namespace) -> int:
    try:
        from modelyard.scale.ray_serve import serve_on_ray
    except ImportError as exc:
        raise ValueError(f"--ray needs Ray Serve: pip install 'modelyard[ray]' ({exc})") from exc
    catalog = _catalog_of(config, preload=args.preload)
    return serve_on_ray(config, catalog, address=args.address)


def _check_exposure(config: ModelyardConfig, *, allow_insecure: bool) -> None:
    """ValueError for a non-loopback bind without auth, unless allowed (gateway/gateway.py)."""
    from modelyard.gateway.gateway import check_exposure

    check_exposure(config.server.host, config.gateway, allow_insecure=allow_insecure)


def serve(config: ModelyardConfig, *, preload: bool = True, log_level: str = "info") -> int:
    """Build the manager and the app, serve until SIGTERM/SIGINT, drain, close; return 0."""
    import uvicorn
    from rich.console import Console

    from modelyard.api.app import build_app
    from modelyard.manager.manager import Manager
    from modelyard.observability.kernels import check_kernels, record_kernels

    console = Console(stderr=True, soft_wrap=True)
    from modelyard.observability.logging import configure_logging

    configure_logging()  # JSON lines (text on a terminal), incl. one access-log line per request
    catalog = _catalog_of(config, preload=preload)
    manager = Manager(catalog, config.manager)
    wanted = [spec.id for spec in catalog if spec.preload or spec.pin]

    async def check() -> None:  # the kernels the workers will load (/ready, /metrics)
        app.state.kernels = await check_kernels()
        record_kernels(app.state.kernels)

    async def startup() -> None:
        started = time.monotonic()
        label = ", ".join(wanted) or "nothing to preload"
        with console.status(f"[bold]loading models:[/] {label}", spinner="dots"):
            await asyncio.gather(check(), manager.start())
        console.print(
            f"[green]ready[/] in {time.monotonic() - started:.1f} s "
            f"(models: {', '.join(wanted) or 'loaded on first request'})"
        )

    app = build_app(manager, config, startup=startup)
    server = config.server
    uv_config = uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        log_level=log_level,
        # uvicorn's loggers propagate to the root handler configure_logging installed (JSON
        # lines or text, like every other log line), and its access log is off: the app writes
        # one structured access line per request itself (modelyard.access)
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(server.drain_timeout_s) or None,
        lifespan="on",
    )
    _print_banner(console, config, [spec.id for spec in catalog] if config.model else wanted)
    uvicorn_server = uvicorn.Server(uv_config)
    # uvicorn drains on SIGTERM/SIGINT, then re-raises the signal to the previous handler; a
    # no-op handler there makes a drained shutdown exit 0 instead of dying by the signal.
    previous = {sig: signal.signal(sig, _drained) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(uvicorn_server.serve())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    console.print("modelyard stopped")
    return 0


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where installed (uvicorn[standard] brings it): its socket writes and
    callbacks cost a fraction of asyncio's, and the API process writes one SSE frame per token
    and stream. None: asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _drained(signum: int, frame: object) -> None:
    """The signal was already handled by uvicorn's graceful shutdown."""


def _print_banner(console: Any, config: ModelyardConfig, wanted: list[str]) -> None:
    url = f"http://{config.server.host}:{config.server.port}"
    model = config.server.textbook.model if config.model is None else wanted[0]
    console.print(f"[bold]modelyard[/] serving on [cyan]{url}[/] (ready: {url}/ready)")
    console.print("example:")
    console.print(
        f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json' "
        f'-d \'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}], '
        f'"max_tokens": 32}}\'',
        markup=False,
        highlight=False,
    )
