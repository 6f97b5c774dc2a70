"""Start the MangaAssist LLM gateway: SageMaker runs ``docker run IMAGE serve``, which runs
:func:`run` through ``containers/llm/serve`` (``python -m gateway.main`` does the same).

    serve [--engine vllm] [--host 0.0.0.0] [--port N]
    serve --vllm-server-args    # vLLM's own server flags for these settings, one a line


The port is --port, else $SAGEMAKER_BIND_TO_PORT, else $PORT, else 8080. Settings come from
GATEWAY_* and ENGINE_* environment variables (docs/gateway.md); any invalid one stops the start
with a one-line error (exit 2), and so does a model directory that differs from its
artifact-manifest.json (written by `make publish`; without one, as in local runs, nothing is
checked). A GPU start cache (GATEWAY_START_CACHE; gateway.start_cache) is verified and used
before the engine is built, or refused with a log line: never fatal. The server answers /ping
at once (503 warming_up) while the engine starts and warmup
runs. SIGTERM stops accepting connections, lets in-flight requests finish for up to
GATEWAY_DRAIN_TIMEOUT_S, then shuts the engine down. Exit 2 also for every start failure that
cannot heal, after one attempt, with one line naming the setting or the library: a block size
the platform cannot use, max_model_len above the model's positions, a model directory without
weights, vLLM that cannot be imported (a module missing, a shared library such as libcuda that
does not load), a configuration vLLM's engine core refuses (a KV cache that cannot hold one
max_model_len request, a KV space larger than the device; gateway.engines.start_failure). Exit
3: the engine could not start within its retries (only failures that may heal are retried), or
its KV capacity cannot hold one max_model_len request under the admission watermark.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import FrameType

import uvicorn

from artifact_manifest import check_model_dir, check_named_adapters
from gateway.app import GatewayRuntime, create_app
from gateway.engines import EngineBuilder, UnknownEngine, engine_builder
from gateway.engines.base import EngineConfigError
from gateway.engines.vllm import server_flags
from gateway.gc_heap import ProcessHeap
from gateway.settings import Settings, SettingsError, load_settings
from gateway.start_cache.loader import prepare_start_cache
from gateway.tokenizer import ChatTokenizer, ModelDirError

EXIT_BAD_CONFIG = 2
EXIT_ENGINE_FAILED = 3
KEEP_ALIVE_S = 75
# The request line and headers h11 buffers before it has seen their end: h11's own default
# (16 KiB) made a large head a race, accepted when it arrived in one read and refused (400, then
# a closed socket the client reads as a reset) when the network split it. A head up to this size
# is accepted however it arrives (docs/gateway.md, "Bodies, headers and connections").
MAX_HEAD_BYTES = 128 * 1024
"""Idle keep-alive connections live longer than the usual 60 s idle timeout of the client side
(load balancers, SageMaker's front end, connection pools), so the server is never the one that
closes a connection the client is about to reuse (that race surfaces as a reset request)."""


def resolve_port(cli_port: int | None, environ: Mapping[str, str]) -> int:
    """--port, else SAGEMAKER_BIND_TO_PORT, else PORT, else 8080; ValueError naming the source."""
    if cli_port is not None:
        source, raw = "--port", str(cli_port)
    elif environ.get("SAGEMAKER_BIND_TO_PORT"):
        source, raw = "SAGEMAKER_BIND_TO_PORT", environ["SAGEMAKER_BIND_TO_PORT"]
    elif environ.get("PORT"):
        source, raw = "PORT", environ["PORT"]
    else:
        return 8080
    try:
        port = int(raw)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise ValueError(f"{source}={raw!r}: expected a TCP port in [1, 65535]")
    return port


def parse_arguments(argv: Sequence[str]) -> argparse.Namespace:
    """The command line (SageMaker's leading ``serve`` argument is accepted and dropped)."""
    parser = argparse.ArgumentParser(prog="serve", description="MangaAssist LLM gateway")
    parser.add_argument("--engine", default=None,
                        help="inference engine (default $GATEWAY_ENGINE, else vllm)")
    parser.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=None,
                        help="port (default $SAGEMAKER_BIND_TO_PORT, else $PORT, else 8080)")
    parser.add_argument("--log-level", default="info", help="uvicorn's own log level")
    parser.add_argument("--vllm-server-args", action="store_true",
                        help="print vLLM's own server flags for these settings, one a line, "
                             "and exit (the engine arguments the gateway gives vLLM)")
    arguments = list(argv)
    if arguments[:1] == ["serve"]:  # SageMaker starts the container as `docker run IMAGE serve`
        arguments = arguments[1:]
    return parser.parse_args(arguments)


def load(args: argparse.Namespace, environ: Mapping[str, str],
         engines: Mapping[str, EngineBuilder] | None = None
         ) -> tuple[int, Settings, EngineBuilder, ChatTokenizer]:
    """Everything checked before the server starts; ValueError (and kin) name what is wrong.
    ``engines``: builders beyond the registered ones (the test side's simulator)."""
    port = resolve_port(args.port, environ)
    settings = load_settings(environ)
    # Before the engine loads a byte: the files SageMaker copied are the ones published.
    verified = check_model_dir(settings.gateway.model_dir)
    if verified.files:
        print(f"serve: {verified.describe()}", file=sys.stderr)
    # Only the adapters named for this model (for a quantized one: gated on it) are served.
    named = check_named_adapters(
        settings.gateway.model_dir, settings.gateway.adapters_dir,
        [(adapter.name, adapter.directory) for adapter in settings.gateway.adapters])
    if named:
        print(f"serve: {named} adapter(s) named for this model in its manifest, checksums match",
              file=sys.stderr)
    engine_name = args.engine or settings.gateway.engine
    builder = engine_builder(engine_name, engines)
    # Construction is cheap by contract and checks what no retry can fix (engine arguments,
    # the model directory, max_model_len against the model's positions): exit 2 now.
    builder(settings)
    tokenizer = ChatTokenizer.from_model_dir(
        settings.gateway.model_dir, cache_max_tokens=settings.gateway.token_cache_max_tokens)
    if engine_name != settings.gateway.engine:
        settings = replace(settings, gateway=replace(settings.gateway, engine=engine_name))
    return port, settings, builder, tokenizer


class GatewayServer(uvicorn.Server):
    """uvicorn, plus: /ping says 'draining' from the moment SIGTERM arrives."""

    def __init__(self, config: uvicorn.Config, runtime: GatewayRuntime) -> None:
        super().__init__(config)
        self.runtime = runtime

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """SIGTERM/SIGINT: mark the gateway draining, then uvicorn's graceful shutdown."""
        self.runtime.lifecycle.draining = True
        super().handle_exit(sig, frame)


def print_server_flags(environ: Mapping[str, str]) -> int:
    """``serve --vllm-server-args``: :func:`gateway.engines.vllm.server_flags`, one a line."""
    try:
        flags = server_flags(load_settings(environ))
    except SettingsError as error:
        print(f"serve: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    print("\n".join(flags))
    return 0


def run(argv: Sequence[str] | None = None,
        engines: Mapping[str, EngineBuilder] | None = None) -> int:
    """Parse arguments and settings, then run uvicorn until SIGTERM; the process exit code.
    ``engines``: builders beyond the registered ones, by ``--engine`` name (the image has none;
    the test side brings its simulator, ``tests/support/sim_serve.py``)."""
    args = parse_arguments(sys.argv[1:] if argv is None else argv)
    if args.vllm_server_args:
        return print_server_flags(os.environ)
    try:
        port, settings, builder, tokenizer = load(args, os.environ, engines)
    except (ValueError, SettingsError, UnknownEngine, ModelDirError, EngineConfigError) as error:
        print(f"serve: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG

    exit_code = 0
    server: GatewayServer | None = None

    def on_fatal(reason: str, config_error: bool) -> None:
        nonlocal exit_code
        exit_code = EXIT_BAD_CONFIG if config_error else EXIT_ENGINE_FAILED
        print(f"serve: {reason}", file=sys.stderr)
        if server is not None:
            server.should_exit = True

    app = create_app(settings, tokenizer=tokenizer, engine_factory=lambda: builder(settings),
                     on_fatal=on_fatal, heap=ProcessHeap())
    config = uvicorn.Config(
        app, host=args.host, port=port, log_level=args.log_level, access_log=False,
        timeout_keep_alive=KEEP_ALIVE_S, h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        timeout_graceful_shutdown=math.ceil(settings.gateway.drain_timeout_s),
        lifespan="on",
    )
    runtime: GatewayRuntime = app.state.runtime
    # Before vLLM is imported (the engine starts in the lifespan): its compile caches, if any.
    runtime.http.start_cache = prepare_start_cache(settings, os.environ,
                                                   log=runtime.telemetry.log).ping_value
    server = GatewayServer(config, runtime)
    # uvicorn re-raises a SIGTERM it captured once its graceful shutdown is done, under the
    # handler that was installed before it started: with the default one the process would die
    # "of" SIGTERM (-15) after draining cleanly. A drained stop is a normal stop: exit 0 (or the
    # fatal code), so the handler it restores is a no-op, reset once the server is gone.
    signal.signal(signal.SIGTERM, _ignore_signal)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return exit_code


def _ignore_signal(signum: int, frame: FrameType | None) -> None:
    """The SIGTERM handler uvicorn restores and re-raises into after its graceful shutdown."""


if __name__ == "__main__":
    sys.exit(run())
