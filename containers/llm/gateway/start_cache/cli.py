"""The start cache's build, pack and verify commands (:mod:`gateway.start_cache`)."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from artifact_manifest import sha256_file
from gateway.engines.base import EngineConfigError
from gateway.settings import SettingsError, load_settings
from gateway.start_cache.fingerprint import (
    MANIFEST_NAME,
    TARBALL_NAME,
    TRITON_PART,
    VLLM_PART,
    StartCacheManifest,
)
from gateway.start_cache.loader import (
    TRITON_CACHE_DIR,
    VLLM_CACHE_ROOT,
    engine_fingerprint_for,
    host_facts,
    verify,
)
from serving_contract.environment import GATEWAY_MODEL_DIR, GATEWAY_START_CACHE

SERVE = Path(__file__).resolve().parents[2] / "serve"
"""``containers/llm/serve`` in the checkout the command runs from."""


def progress(message: str) -> None:
    """One progress line on stderr."""
    print(f"[start-cache] {message}", file=sys.stderr, flush=True)


def read_env_file(path: Path | None) -> dict[str, str]:
    """``KEY=VALUE`` lines (blank lines, ``#`` comments skipped); ValueError naming a bad line."""
    if path is None:
        return {}
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        key, sep, value = text.removeprefix("export ").partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{path}:{number}: expected KEY=VALUE, got {line!r}")
        values[key.strip()] = value.strip().strip("'\"")
    return values


def gateway_environ(model_dir: Path, env_file: Path | None,
                    base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The gateway's environment: ``base`` (default this process's), the env file, the model."""
    environ = dict(os.environ if base is None else base)
    environ.update(read_env_file(env_file))
    environ[GATEWAY_MODEL_DIR] = str(model_dir)
    return environ


def _add_folder(archive: tarfile.TarFile, folder: Path, part: str) -> int:
    """Add ``folder``'s files under ``part/``; links are refused (the container would refuse
    them too). The number of files."""
    count = 0
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            raise ValueError(f"{path}: a symlink; a start cache holds files only")
        if path.is_file():
            archive.add(path, arcname=f"{part}/{path.relative_to(folder).as_posix()}",
                        recursive=False)
            count += 1
    return count


def pack(triton: Path | None, vllm_cache: Path | None, model_dir: Path, out: Path,
         environ: Mapping[str, str]) -> StartCacheManifest:
    """Write ``out/start-cache.tar.gz`` and ``out/start-cache.json`` from the cache folders, for
    this host and the engine ``environ``'s settings start on ``model_dir``."""
    settings = load_settings(gateway_environ(model_dir, None, environ))
    fingerprint = engine_fingerprint_for(settings)
    host = host_facts()
    out.mkdir(parents=True, exist_ok=True)
    tarball = out / TARBALL_NAME
    contents: list[str] = []
    with tarfile.open(tarball, "w:gz") as archive:
        for part, folder in ((TRITON_PART, triton), (VLLM_PART, vllm_cache)):
            if folder is None:
                continue
            if not folder.is_dir():
                raise ValueError(f"{folder}: not a directory")
            count = _add_folder(archive, folder, part)
            progress(f"{part}: {count} files from {folder}")
            if count:
                contents.append(part)
    if not contents:
        tarball.unlink()
        raise ValueError("no cache files to pack: the engine compiled nothing into "
                         f"{triton} / {vllm_cache} (an eager engine on a CPU host compiles none)")
    manifest = StartCacheManifest(
        host=host, engine=fingerprint, tarball_sha256=sha256_file(tarball),
        tarball_bytes=tarball.stat().st_size, contents=tuple(contents),
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
    (out / MANIFEST_NAME).write_text(manifest.to_json(), encoding="utf-8")
    progress(f"wrote {tarball} ({manifest.tarball_bytes / 2**20:.1f} MiB) and "
             f"{out / MANIFEST_NAME}: {host.gpu_name} ({host.compute_capability}), vllm "
             f"{host.vllm_version}, engine fingerprint {fingerprint.digest[:12]}…")
    return manifest


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Until /ping answers 200; RuntimeError if the gateway exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the gateway exited with {process.returncode} before /ping 200")
        try:
            with urllib.request.urlopen(f"{url}/ping", timeout=2) as response:
                if response.status == 200:
                    return
        except urllib.error.HTTPError as error:
            last = f"{error.code}"
        except OSError:
            last = "no answer"
        time.sleep(0.5)
    raise RuntimeError(f"/ping not 200 within {timeout_s:g} s (last: {last})")


def build(model_dir: Path, out: Path, env_file: Path | None, *, serve: Sequence[str],
          timeout_s: float, base: Mapping[str, str] | None = None) -> StartCacheManifest:
    """Start the gateway with empty caches, wait for /ping 200 (warmup compiles every shape),
    stop it, pack what it compiled. ``base``: the environment (default this process's)."""
    environ = gateway_environ(model_dir, env_file, base)
    work = Path(tempfile.mkdtemp(prefix="start-cache-build-"))
    triton, vllm_cache = work / TRITON_PART, work / VLLM_PART
    triton.mkdir()
    vllm_cache.mkdir()
    environ.update({TRITON_CACHE_DIR: str(triton), VLLM_CACHE_ROOT: str(vllm_cache),
                    GATEWAY_START_CACHE: "off"})
    port = free_port()
    log_path = Path(tempfile.mkstemp(prefix="start-cache-build-", suffix=".log")[1])
    progress(f"starting the gateway on :{port} with empty caches in {work} (log: {log_path})")
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen([*serve, "--host", "127.0.0.1", "--port", str(port)],
                                   env=environ, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(f"http://127.0.0.1:{port}", process, timeout_s)
            progress(f"/ping 200 after {time.monotonic() - started:.1f} s; stopping the gateway")
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    try:
        return pack(triton, vllm_cache, model_dir, out, environ)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_verify(cache_dir: Path, model_dir: Path, env_file: Path | None) -> int:
    """Print the verdict for this host; 0 accepted, 1 refused."""
    settings = load_settings(gateway_environ(model_dir, env_file))
    _, verdict = verify(cache_dir, settings)
    print(f"start cache {cache_dir}: {verdict.describe()}")
    return 0 if verdict.accepted else 1


def parse_arguments(argv: Sequence[str]) -> argparse.Namespace:
    """The three commands' options."""
    parser = argparse.ArgumentParser(prog="python -m gateway.start_cache",
                                     description="Build, pack and verify the GPU start cache.")
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="start the gateway with empty caches, pack")
    pack_parser = commands.add_parser("pack", help="pack cache folders an earlier run filled")
    verify_parser = commands.add_parser("verify", help="the verdict on this host (exit 1: no)")
    for sub in (build_parser, pack_parser, verify_parser):
        sub.add_argument("--model-dir", type=Path, required=True,
                         help="the model directory the engine starts on")
        sub.add_argument("--gateway-env-file", type=Path, default=None,
                         help="KEY=VALUE lines of GATEWAY_*/ENGINE_* settings (added to the "
                              "environment)")
    for sub in (build_parser, pack_parser):
        sub.add_argument("--out", type=Path, required=True, help="where the two files go")
    build_parser.add_argument("--serve", default=shlex.join([sys.executable, str(SERVE)]),
                              help="the gateway's command (default: this Python's "
                                   "containers/llm/serve)")
    build_parser.add_argument("--timeout", type=float, default=1800.0,
                              help="seconds to wait for /ping 200 (default 1800)")
    pack_parser.add_argument("--triton", type=Path, required=True, help="TRITON_CACHE_DIR")
    pack_parser.add_argument("--vllm-cache", type=Path, default=None, help="VLLM_CACHE_ROOT")
    verify_parser.add_argument("cache_dir", type=Path, help="holds start-cache.json and .tar.gz")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str]) -> int:
    """Run one command; exit 2 on a usage or settings error, 1 on a refusal or failed build."""
    args = parse_arguments(argv)
    try:
        if args.command == "verify":
            return run_verify(args.cache_dir, args.model_dir, args.gateway_env_file)
        if args.command == "pack":
            environ = gateway_environ(args.model_dir, args.gateway_env_file)
            pack(args.triton, args.vllm_cache, args.model_dir, args.out, environ)
        else:
            build(args.model_dir, args.out, args.gateway_env_file, serve=shlex.split(args.serve),
                  timeout_s=args.timeout)
    except (SettingsError, EngineConfigError, ValueError, OSError) as error:
        print(f"start-cache: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        print(f"start-cache: build failed: {error}", file=sys.stderr)
        return 1
    return 0
