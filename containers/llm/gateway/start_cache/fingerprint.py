"""The GPU start cache's manifest and its verdict: may this host, with this engine configuration,
use a cache built elsewhere? (docs/develop.md#the-start-cache, issue 38).

A start cache holds what a GPU start otherwise compiles on its first use: Triton's kernel cache
(``TRITON_CACHE_DIR``) and vLLM's torch.compile cache (``VLLM_CACHE_ROOT``). Those kernels are
only valid for the GPU, the library versions and the engine arguments they were compiled for, so
the cache carries a :class:`StartCacheManifest` naming all three, and :func:`check` refuses —
naming the field, the cache's value and this host's — any difference: a *foreign* cache (another
GPU) or a *stale* one (other versions, other engine arguments) is never trusted. A refused cache
costs only time: the start compiles as it would without one.

The engine fingerprint is the SHA-256 of the engine arguments that change compiled kernels or the
shapes they are compiled for (:data:`KERNEL_ARGUMENTS`, from the gateway's own
``engine_arguments``) and of the model's architecture (:data:`ARCHITECTURE_KEYS` of
``config.json``); its inputs are kept beside the digest so that a refusal names what differs.

Pure module: no I/O; the reading and the extraction are :mod:`gateway.start_cache.loader`'s.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath
from typing import Any

FORMAT_VERSION = 1
MANIFEST_NAME = "start-cache.json"
TARBALL_NAME = "start-cache.tar.gz"
CACHE_DIR_NAME = "start-cache"
"""The cache's folder inside the model directory (``<GATEWAY_MODEL_DIR>/start-cache``)."""
TRITON_PART = "triton"
VLLM_PART = "vllm"
PARTS: tuple[str, ...] = (TRITON_PART, VLLM_PART)
"""The tarball's top-level folders: Triton's kernel cache, vLLM's cache root."""
CPU = "cpu"
"""The GPU name and compute capability of a host without a GPU (vLLM's CPU build)."""

KERNEL_ARGUMENTS: tuple[str, ...] = (
    "dtype", "quantization", "kv_cache_dtype", "max_num_batched_tokens", "max_num_seqs",
    "max_model_len", "enforce_eager", "attention_backend", "enable_lora", "max_lora_rank",
    "max_loras", "block_size", "tensor_parallel_size",
)
"""``AsyncEngineArgs`` fields that change what is compiled: the kernels' dtypes and
quantization, the batch shapes CUDA graphs and torch.compile specialise on (max_num_seqs,
max_num_batched_tokens), the attention backend and block size, the LoRA kernels' slots and rank,
and the sharding. ``max_model_len`` enters vLLM's own compile hash too. Left out on purpose: the
weights themselves, ``load_format``, ``gpu_memory_utilization`` and the KV pool size (they change
no kernel)."""

ARCHITECTURE_KEYS: tuple[str, ...] = (
    "architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "torch_dtype",
    "rope_scaling", "tie_word_embeddings",
)
"""``config.json`` fields that decide the model's kernels (shapes, dtype)."""
QUANTIZATION_KEYS: tuple[str, ...] = ("quant_method", "bits", "group_size", "format")
"""``config.json``'s ``quantization_config`` fields that decide the quantized kernels."""

HOST_FIELDS: tuple[str, ...] = (
    "gpu_name", "compute_capability", "vllm_version", "torch_version", "triton_version",
    "cuda_version", "python_version",
)
"""What the kernels are valid for on the host's side, in the order :func:`check` compares
them (the GPU first: a foreign cache is named as such)."""

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class StartCacheError(ValueError):
    """A start cache's manifest or tarball is malformed; the message names the field."""


@dataclass(frozen=True)
class HostFacts:
    """What this host compiles for: its GPU (``cpu`` without one) and the library versions
    (``none`` for a library that is not installed)."""

    gpu_name: str
    compute_capability: str
    vllm_version: str
    torch_version: str
    triton_version: str
    cuda_version: str
    python_version: str


@dataclass(frozen=True)
class EngineFingerprint:
    """The SHA-256 of the kernel-relevant engine arguments and model architecture, and those
    inputs (so a refusal names what differs)."""

    digest: str
    inputs: Mapping[str, Any]


@dataclass(frozen=True)
class StartCacheManifest:
    """``start-cache.json``: what a start cache was built for and what its tarball is."""

    host: HostFacts
    engine: EngineFingerprint
    tarball_sha256: str
    tarball_bytes: int
    contents: tuple[str, ...]
    created_at: str
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        """Stable, pretty JSON, newline-terminated."""
        data = {
            "format_version": self.format_version,
            "created_at": self.created_at,
            "host": asdict(self.host),
            "engine_fingerprint": self.engine.digest,
            "engine_inputs": dict(self.engine.inputs),
            "tarball": {"name": TARBALL_NAME, "sha256": self.tarball_sha256,
                        "bytes": self.tarball_bytes},
            "contents": list(self.contents),
        }
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class Verdict:
    """:func:`check`'s answer: accepted, or refused with one line naming the field, the cache's
    value and this host's."""

    accepted: bool
    reason: str = ""
    field: str = ""

    def describe(self) -> str:
        """``accepted`` or ``refused: <reason>``."""
        return "accepted" if self.accepted else f"refused: {self.reason}"


def _canonical(value: Any) -> Any:
    """``value`` with mappings sorted and tuples as lists, for a stable JSON digest."""
    if isinstance(value, Mapping):
        return {str(key): _canonical(value[key]) for key in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [_canonical(item) for item in value]
    return value


def engine_fingerprint(engine_args: Mapping[str, Any],
                       model_config: Mapping[str, Any]) -> EngineFingerprint:
    """The fingerprint of ``engine_args`` (``gateway.engines.vllm.engine_arguments``'s keyword
    arguments; an argument left out is ``None``) and ``model_config`` (``config.json``)."""
    inputs: dict[str, Any] = {name: engine_args.get(name) for name in KERNEL_ARGUMENTS}
    inputs.update({f"model.{key}": model_config.get(key) for key in ARCHITECTURE_KEYS})
    quant = model_config.get("quantization_config")
    quant = quant if isinstance(quant, Mapping) else {}
    inputs.update({f"model.quantization_config.{key}": quant.get(key)
                   for key in QUANTIZATION_KEYS})
    canonical = _canonical(inputs)
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), default=str)
    return EngineFingerprint(digest=hashlib.sha256(text.encode("utf-8")).hexdigest(),
                             inputs=canonical)


def _engine_difference(cache: EngineFingerprint, host: EngineFingerprint) -> Verdict:
    """The refusal for two different fingerprints, naming the first input that differs."""
    for name in sorted(set(cache.inputs) | set(host.inputs)):
        if cache.inputs.get(name) != host.inputs.get(name):
            return Verdict(False, f"engine argument {name}: the cache was built for "
                                  f"{cache.inputs.get(name)!r}, this engine runs "
                                  f"{host.inputs.get(name)!r} (stale: engine fingerprint "
                                  f"{cache.digest[:12]}… vs {host.digest[:12]}…)",
                           field=f"engine.{name}")
    return Verdict(False, f"engine fingerprint: the cache's {cache.digest[:12]}… differs from "
                          f"this engine's {host.digest[:12]}…", field="engine_fingerprint")


def check(manifest: StartCacheManifest, host_facts: HostFacts,
          engine: EngineFingerprint | str) -> Verdict:
    """Accept ``manifest``'s cache on this host for this engine configuration, or refuse it.

    Refused: another format version, another GPU or compute capability (a foreign cache), other
    vLLM / torch / Triton / CUDA / Python versions or another engine fingerprint (a stale
    cache), or a manifest whose tarball is empty. ``engine`` is this engine's
    :class:`EngineFingerprint` (or only its digest, when a refusal need not name the argument).
    """
    if manifest.format_version != FORMAT_VERSION:
        return Verdict(False, f"format_version: the cache's {manifest.format_version!r}, this "
                              f"gateway reads {FORMAT_VERSION}", field="format_version")
    for name in HOST_FIELDS:
        cached, here = getattr(manifest.host, name), getattr(host_facts, name)
        if cached != here:
            kind = "foreign" if name in ("gpu_name", "compute_capability") else "stale"
            return Verdict(False, f"{name}: the cache was built for {cached!r}, this host has "
                                  f"{here!r} ({kind})", field=name)
    digest = engine if isinstance(engine, str) else engine.digest
    if manifest.engine.digest != digest:
        if isinstance(engine, str):
            return Verdict(False, f"engine_fingerprint: the cache's {manifest.engine.digest[:12]}…"
                                  f" differs from this engine's {digest[:12]}… (stale)",
                           field="engine_fingerprint")
        return _engine_difference(manifest.engine, engine)
    if not manifest.contents:
        return Verdict(False, "contents: the cache holds neither a Triton nor a vLLM cache",
                       field="contents")
    return Verdict(True)


def _text(data: Mapping[str, Any], key: str, where: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise StartCacheError(f"{where}.{key}: {value!r} is not a non-empty string")
    return value


def manifest_from_json(text: str, *, source: str = MANIFEST_NAME) -> StartCacheManifest:
    """Parse ``start-cache.json``; StartCacheError names ``source`` and the bad field."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise StartCacheError(f"{source}: not valid JSON ({error.msg})") from None
    if not isinstance(data, dict):
        raise StartCacheError(f"{source}: expected a JSON object")
    version = data.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise StartCacheError(f"{source}: format_version {version!r} is not an integer")
    host = data.get("host")
    tarball = data.get("tarball")
    inputs = data.get("engine_inputs")
    contents = data.get("contents")
    if not isinstance(host, dict) or not isinstance(tarball, dict) \
            or not isinstance(inputs, dict) or not isinstance(contents, list):
        raise StartCacheError(f"{source}: host, tarball and engine_inputs must be objects, "
                              "contents a list")
    digest = _text(data, "engine_fingerprint", source)
    sha = _text(tarball, "sha256", f"{source}: tarball")
    size = tarball.get("bytes")
    if not _SHA256.match(digest) or not _SHA256.match(sha):
        raise StartCacheError(f"{source}: engine_fingerprint and tarball.sha256 must be "
                              "lowercase hex SHA-256")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise StartCacheError(f"{source}: tarball.bytes {size!r} is not a byte count")
    unknown = [part for part in contents if part not in PARTS]
    if unknown:
        raise StartCacheError(f"{source}: contents {unknown!r}: accepted {list(PARTS)}")
    return StartCacheManifest(
        host=HostFacts(**{name: _text(host, name, f"{source}: host") for name in HOST_FIELDS}),
        engine=EngineFingerprint(digest=digest, inputs=inputs),
        tarball_sha256=sha, tarball_bytes=size, contents=tuple(contents),
        created_at=_text(data, "created_at", source), format_version=version)


@dataclass(frozen=True)
class Member:
    """What :func:`member_problem` needs of one tar member (``tarfile.TarInfo``'s view)."""

    name: str
    kind: str
    """``file``, ``dir``, ``symlink``, ``hardlink`` or ``other`` (devices, FIFOs)."""
    linkname: str = ""


def _escapes(path: str) -> bool:
    """Whether a POSIX path is absolute or climbs out of its root."""
    pure = PurePosixPath(path)
    if path.startswith("/") or "\\" in path or pure.is_absolute():
        return True
    depth = 0
    for part in pure.parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            return True
    return False


def member_problem(member: Member) -> str | None:
    """Why a tar member may not be extracted, or None: no absolute path, no ``..``, only files,
    folders and links that stay inside the cache, under one of :data:`PARTS`."""
    name = member.name
    if not name or _escapes(name) or ".." in PurePosixPath(name).parts:
        return f"{name!r}: an absolute path or one with '..' (refused)"
    if PurePosixPath(name).parts[0] not in PARTS:
        return f"{name!r}: outside the cache's folders {list(PARTS)}"
    if member.kind == "other":
        return f"{name!r}: not a file, folder or link (devices and FIFOs are refused)"
    if member.kind in ("symlink", "hardlink"):
        target = member.linkname
        resolved = (str(PurePosixPath(name).parent / target) if member.kind == "symlink"
                    else target)
        if not target or target.startswith("/") or _escapes(resolved):
            return f"{name!r}: a link to {target!r}, outside the cache (refused)"
    return None


__all__ = [
    "ARCHITECTURE_KEYS",
    "CACHE_DIR_NAME",
    "CPU",
    "FORMAT_VERSION",
    "HOST_FIELDS",
    "KERNEL_ARGUMENTS",
    "MANIFEST_NAME",
    "PARTS",
    "TARBALL_NAME",
    "TRITON_PART",
    "VLLM_PART",
    "EngineFingerprint",
    "HostFacts",
    "Member",
    "StartCacheError",
    "StartCacheManifest",
    "Verdict",
    "check",
    "engine_fingerprint",
    "manifest_from_json",
    "member_problem",
]
