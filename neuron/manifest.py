"""manifest.json: what the compiler produced, and the contract the server loads it by.

SageMaker unpacks model.tar.gz to /opt/ml/model::

    manifest.json        this file
    labels.json          the classifier head's labels, in output order
    model-b1.pt          one TorchScript per compiled batch size (fixed shape: batch × seq len)
    model-b8.pt
    tokenizer.json       the fast tokenizer (plus whatever else save_pretrained wrote)

The manifest records the target, the fixed shapes, the labels, compiler / torch / transformers
versions, parity against the eager model and the measured latency, plus a SHA-256 per file so
the server can refuse a truncated or mixed-up artifact. Every reader error names the field.

Pure module (json in, dataclasses out), Python 3.10-compatible.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from neuron.latency import LatencyStats
from neuron.parity import ParityReport
from neuron.targets import CompileTarget, parse_target

MANIFEST_FILE = "manifest.json"
LABELS_FILE = "labels.json"
TOKENIZER_FILE = "tokenizer.json"
FORMAT_VERSION = 1
"""Bumped when a reader of an older version could misread a newer manifest."""

INPUT_NAMES: tuple[str, ...] = ("input_ids", "attention_mask")
"""Positional inputs of every compiled model, in order (int64, shape batch × seq len)."""

_SAFE_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ManifestError(ValueError):
    """manifest.json is missing a field, has a wrong value, or does not match the files."""


def model_file_name(batch_size: int) -> str:
    """The TorchScript file of one compiled batch size."""
    return f"model-b{batch_size}.pt"


@dataclass(frozen=True)
class ArtifactManifest:
    """One compiled intent-classifier artifact."""

    target: CompileTarget
    labels: tuple[str, ...]
    max_seq_length: int
    batch_sizes: tuple[int, ...]
    """Compiled batch sizes, ascending; each has its own TorchScript file."""
    model_files: Mapping[int, str]
    pad_token_id: int
    pipeline_cores: int
    """NeuronCores one copy of the model spans (inf1 NeuronCore Pipeline); 1 elsewhere."""
    compiler: str
    versions: Mapping[str, str]
    """Package versions at compile time (torch, transformers, torch-neuron, neuron-cc, ...)."""
    parity: ParityReport | None
    """None only when compiled with --skip-device-checks (no NeuronCore on the compile host)."""
    latency: Mapping[int, LatencyStats]
    files_sha256: Mapping[str, str]
    source_model: str
    created_unix_s: int
    format_version: int = FORMAT_VERSION
    input_names: tuple[str, ...] = INPUT_NAMES
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (integer keys become strings, as JSON requires)."""
        return {
            "format_version": self.format_version,
            "target": self.target.value,
            "labels": list(self.labels),
            "max_seq_length": self.max_seq_length,
            "batch_sizes": list(self.batch_sizes),
            "input_names": list(self.input_names),
            "model_files": {str(b): name for b, name in sorted(self.model_files.items())},
            "pad_token_id": self.pad_token_id,
            "pipeline_cores": self.pipeline_cores,
            "compiler": self.compiler,
            "versions": dict(sorted(self.versions.items())),
            "parity": None if self.parity is None else self.parity.to_dict(),
            "latency": {str(b): s.to_dict() for b, s in sorted(self.latency.items())},
            "files_sha256": dict(sorted(self.files_sha256.items())),
            "source_model": self.source_model,
            "created_unix_s": self.created_unix_s,
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        """Pretty, stable JSON text."""
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n"

    @property
    def servable_problem(self) -> str | None:
        """Why a server must refuse this artifact, or None if it may serve it."""
        if self.parity is not None and not self.parity.passed:
            return f"parity failed at compile time: {self.parity.describe()}"
        return None


def _require(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    if name not in data:
        raise ManifestError(f"manifest.{name}: missing")
    value = data[name]
    if isinstance(value, bool) and kind is not bool:
        raise ManifestError(f"manifest.{name}: expected {_kind_name(kind)}, got {value!r}")
    if not isinstance(value, kind):
        raise ManifestError(f"manifest.{name}: expected {_kind_name(kind)}, got {value!r}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ManifestError(f"{where}: {value!r} must be an integer >= 1")
    return value


def _batch_key(key: str, where: str) -> int:
    if not key.isdigit():
        raise ManifestError(f"{where}: key {key!r} is not a batch size")
    return _positive_int(int(key), f"{where}[{key!r}]")


def _file_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _SAFE_FILE_NAME.match(value) or ".." in value:
        raise ManifestError(f"{where}: {value!r} is not a plain file name in the model directory")
    return value


def manifest_from_dict(data: Mapping[str, Any]) -> ArtifactManifest:
    """Validate and read a manifest; raise ManifestError naming the first bad field."""
    if not isinstance(data, Mapping):
        raise ManifestError(f"manifest: expected a JSON object, got {type(data).__name__}")
    version = _require(data, "format_version", int)
    if version != FORMAT_VERSION:
        raise ManifestError(f"manifest.format_version: {version!r} is not supported; "
                            f"this reader accepts {FORMAT_VERSION}")
    try:
        target = parse_target(_require(data, "target", str), field="manifest.target")
    except ValueError as error:
        raise ManifestError(str(error)) from None
    labels = _read_labels(data)
    max_seq_length = _positive_int(_require(data, "max_seq_length", int),
                                   "manifest.max_seq_length")
    batch_sizes = _read_batch_sizes(data)
    input_names = tuple(_require(data, "input_names", list))
    if input_names != INPUT_NAMES:
        raise ManifestError(f"manifest.input_names: {list(input_names)} is not supported; "
                            f"expected {list(INPUT_NAMES)}")
    model_files = _read_model_files(data, batch_sizes)
    pad_token_id = _require(data, "pad_token_id", int)
    if pad_token_id < 0:
        raise ManifestError(f"manifest.pad_token_id: {pad_token_id!r} must be >= 0")
    pipeline_cores = _positive_int(_require(data, "pipeline_cores", int),
                                   "manifest.pipeline_cores")
    versions_raw = _require(data, "versions", dict)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in versions_raw.items()):
        raise ManifestError("manifest.versions: expected an object of strings")
    parity, latency = _read_measurements(data, batch_sizes)
    files_sha256 = _read_digests(data, model_files)
    notes = _require(data, "notes", list) if "notes" in data else []
    return ArtifactManifest(
        target=target, labels=labels, max_seq_length=max_seq_length,
        batch_sizes=batch_sizes, model_files=model_files, pad_token_id=pad_token_id,
        pipeline_cores=pipeline_cores, compiler=_require(data, "compiler", str),
        versions=dict(versions_raw), parity=parity, latency=latency,
        files_sha256=files_sha256, source_model=_require(data, "source_model", str),
        created_unix_s=_require(data, "created_unix_s", int), format_version=version,
        input_names=input_names, notes=tuple(str(n) for n in notes),
    )


def _read_labels(data: Mapping[str, Any]) -> tuple[str, ...]:
    labels_raw = _require(data, "labels", list)
    if not labels_raw or not all(isinstance(x, str) and x for x in labels_raw):
        raise ManifestError(f"manifest.labels: expected a non-empty list of names, got "
                            f"{labels_raw!r}")
    if len(set(labels_raw)) != len(labels_raw):
        raise ManifestError(f"manifest.labels: duplicate label in {labels_raw!r}")
    return tuple(labels_raw)


def _read_batch_sizes(data: Mapping[str, Any]) -> tuple[int, ...]:
    sizes_raw = _require(data, "batch_sizes", list)
    if not sizes_raw:
        raise ManifestError("manifest.batch_sizes: empty; at least one compiled batch size")
    batch_sizes = tuple(_positive_int(b, "manifest.batch_sizes") for b in sizes_raw)
    if list(batch_sizes) != sorted(set(batch_sizes)):
        raise ManifestError(f"manifest.batch_sizes: {list(batch_sizes)} must be ascending "
                            "without repeats")
    return batch_sizes


def _read_model_files(data: Mapping[str, Any], batch_sizes: Sequence[int]) -> dict[int, str]:
    """One TorchScript file per compiled batch size, no more, no fewer."""
    files_raw = _require(data, "model_files", dict)
    model_files = {_batch_key(k, "manifest.model_files"):
                   _file_name(v, f"manifest.model_files[{k!r}]") for k, v in files_raw.items()}
    if sorted(model_files) != list(batch_sizes):
        raise ManifestError(f"manifest.model_files: has batch sizes {sorted(model_files)}, "
                            f"batch_sizes says {list(batch_sizes)}")
    return model_files


def _read_measurements(data: Mapping[str, Any], batch_sizes: Sequence[int]
                       ) -> tuple[ParityReport | None, dict[int, LatencyStats]]:
    """Parity (absent with --skip-device-checks) and latency per compiled batch size."""
    parity_raw = data.get("parity")
    try:
        parity = None if parity_raw is None else ParityReport.from_dict(
            parity_raw, where="manifest.parity")
        latency = {_batch_key(k, "manifest.latency"):
                   LatencyStats.from_dict(v, where=f"manifest.latency[{k!r}]")
                   for k, v in _require(data, "latency", dict).items()}
    except ManifestError:
        raise
    except (ValueError, AttributeError, TypeError) as error:
        raise ManifestError(str(error)) from None
    unknown = sorted(set(latency) - set(batch_sizes))
    if unknown:
        raise ManifestError(f"manifest.latency: batch sizes {unknown} were not compiled")
    return parity, latency


def _read_digests(data: Mapping[str, Any], model_files: Mapping[int, str]) -> dict[str, str]:
    """A lowercase hex SHA-256 per packed file; every model file must have one."""
    files_sha256: dict[str, str] = {}
    for name, digest in _require(data, "files_sha256", dict).items():
        _file_name(name, "manifest.files_sha256")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ManifestError(f"manifest.files_sha256[{name!r}]: {digest!r} is not a "
                                "lowercase hex SHA-256")
        files_sha256[name] = digest
    missing = sorted(set(model_files.values()) - set(files_sha256))
    if missing:
        raise ManifestError(f"manifest.files_sha256: no digest for {missing}")
    return files_sha256


def manifest_from_json(text: str) -> ArtifactManifest:
    """Parse manifest.json text; raise ManifestError for bad JSON or a bad field."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ManifestError(f"manifest.json: not valid JSON ({error})") from None
    return manifest_from_dict(data)


def labels_from_json(text: str) -> tuple[str, ...]:
    """Parse labels.json (a JSON list of label names)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ManifestError(f"labels.json: not valid JSON ({error})") from None
    if not isinstance(data, list) or not data or not all(isinstance(x, str) for x in data):
        raise ManifestError(f"labels.json: expected a non-empty list of strings, got {data!r}")
    return tuple(data)


def check_labels(manifest: ArtifactManifest, labels_file: Sequence[str],
                 expected: Sequence[str]) -> None:
    """Refuse an artifact whose labels disagree with labels.json or with the router's intents.

    The classifier head's output order is the label order: a model compiled for another label
    list would answer with the wrong intents, silently.
    """
    if tuple(labels_file) != manifest.labels:
        raise ManifestError(f"labels.json {list(labels_file)} differs from manifest.labels "
                            f"{list(manifest.labels)}")
    if tuple(expected) != manifest.labels:
        raise ManifestError(f"manifest.labels {list(manifest.labels)} differ from the router's "
                            f"intents {list(expected)} (same names, same order required)")
