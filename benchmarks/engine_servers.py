"""What the real-engine benchmarks share: the repository on sys.path, the tiny model from the
fixture cache, and either server started on it and waited for.

Each benchmark runs as ``python benchmarks/<name>.py``, which puts this folder first on sys.path,
so ``import engine_servers`` finds this module. Importing it puts the repository and the
gateway's folder (``containers/llm``) on sys.path, so the benchmark's ``gateway``, ``prompts`` and
``tests.support`` imports that follow it resolve. The servers themselves are
``tests/support/cpu_engine.py``'s: the same engine arguments as the real-engine test tier.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "containers" / "llm")]

from tests.support.cpu_engine import (  # noqa: E402
    VLLM_PYTHON,
    EngineConfig,
    Served,
    ServerProcess,
    descendants,
    gateway_command,
    gateway_env,
    vllm_server_command,
)
from tests.support.network import free_port  # noqa: E402
from tests.support.tiny_llama import AdapterFixture, cached_model_dir  # noqa: E402

__all__ = ["REPO", "VLLM_PYTHON", "AdapterFixture", "EngineConfig", "Served", "ServerProcess",
           "descendants", "running", "start_server", "tiny_model", "vllm_missing"]

FIXTURE_CACHE = REPO / ".cache" / "fixtures"
STARTUP_TIMEOUT_S = 600
"""Either server loads the model and compiles on two cores: minutes under load."""


def vllm_missing() -> bool:
    """True, with what to do on stderr, when the real-engine environment is not built."""
    if VLLM_PYTHON.is_file():
        return False
    print("benchmark needs .venv-vllm (make test-engine builds it)", file=sys.stderr)
    return True


def tiny_model(**options: Any) -> Path:
    """The tiny random Llama-3 (built once, cached under .cache/fixtures); ``options`` go to
    :func:`tests.support.tiny_llama.cached_model_dir`."""
    return cached_model_dir(FIXTURE_CACHE, **options)


def start_server(kind: str, served: Served, engine: EngineConfig, log_dir: Path, *,
                 name: str | None = None, env: Mapping[str, str] | None = None,
                 extra: Sequence[str] = ()) -> ServerProcess:
    """``kind`` "vllm": vLLM's own OpenAI server (``extra``: more of its own flags, e.g.
    ``--max-num-queued-tokens 3000``); otherwise the gateway, with ``env`` on top of its
    GATEWAY_/ENGINE_ variables. Started on a free port and waited for until healthy."""
    port = free_port()
    if kind == "vllm":
        server = ServerProcess(vllm_server_command(served, engine, port=port, extra=extra),
                               port=port, log_dir=log_dir, name=name or kind, env={})
        server.wait_healthy("/health", timeout_s=STARTUP_TIMEOUT_S)
        return server
    server = ServerProcess(gateway_command(port=port), port=port, log_dir=log_dir,
                           name=name or kind, env=gateway_env(served, engine, **(env or {})))
    server.wait_healthy("/ping", timeout_s=STARTUP_TIMEOUT_S)
    return server


@contextmanager
def running(names: Sequence[str], served: Served, engine: EngineConfig, *, log_prefix: str,
            env: Mapping[str, Mapping[str, str]] | None = None,
            extra: Mapping[str, Sequence[str]] | None = None
            ) -> Iterator[dict[str, ServerProcess]]:
    """Each named server started in turn (the name is :func:`start_server`'s kind, ``env[name]``
    its extra variables; a name in ``extra`` is vLLM's server with ``extra[name]``, its own
    flags) and announced on stderr, logs in a temporary folder; every one started is stopped on
    leaving, also when a later one fails to start."""
    extra = extra or {}
    with tempfile.TemporaryDirectory(prefix=log_prefix) as log_dir:
        servers: dict[str, ServerProcess] = {}
        try:
            for name in names:
                print(f"starting {name} ...", file=sys.stderr, flush=True)
                kind = "vllm" if name in extra else name
                servers[name] = start_server(kind, served, engine, Path(log_dir), name=name,
                                             env=(env or {}).get(name),
                                             extra=extra.get(name, ()))
            yield servers
        finally:
            for server in servers.values():
                server.stop()
