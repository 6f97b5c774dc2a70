"""What a checkpoint directory holds: its weight bytes and its quantization format.

Weight memory is measured from the safetensors headers (the exact byte ranges of every tensor),
not from file sizes, so a header or an index file never counts as weights; both figures are
reported. The quantization format is read from ``config.json`` the way vLLM reads it:
``quant_method: compressed-tensors`` (llm-compressor) or ``quant_method: awq`` (AutoAWQ).

Pure module: standard library only; reads files, imports no ML library.
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAFETENSORS_DTYPE_BYTES: dict[str, float] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
    "F4": 0.5,
}  # fmt: skip
"""Bytes per element of each safetensors dtype."""

MAX_HEADER_BYTES = 100 * 1024 * 1024
"""safetensors refuses larger headers; so do we (a corrupt length would otherwise be read)."""

INDEX_FILE = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A checkpoint directory or file is missing, malformed or not what was expected."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry in a safetensors header."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Parse the header of one ``.safetensors`` file (the tensors are not read)."""
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) != 8:
                raise CheckpointError(f"{path}: too short to be a safetensors file")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > MAX_HEADER_BYTES:
                raise CheckpointError(f"{path}: header length {header_len} is not plausible")
            raw = handle.read(header_len)
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read ({error.strerror})") from error
    if len(raw) != header_len:
        raise CheckpointError(f"{path}: header truncated ({len(raw)} of {header_len} bytes)")
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path}: header is not JSON") from error
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = entry["dtype"]
            shape = tuple(int(dim) for dim in entry["shape"])
            start, end = (int(offset) for offset in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{path}: tensor {name!r} has a malformed entry") from error
        if dtype not in SAFETENSORS_DTYPE_BYTES:
            raise CheckpointError(f"{path}: tensor {name!r} has unknown dtype {dtype!r}")
        elements = 1
        for dim in shape:
            elements *= dim
        expected = int(elements * SAFETENSORS_DTYPE_BYTES[dtype])
        if end - start != expected:
            raise CheckpointError(
                f"{path}: tensor {name!r} spans {end - start} bytes but {dtype}{list(shape)} "
                f"needs {expected}"
            )
        tensors[name] = TensorInfo(name=name, dtype=dtype, shape=shape, nbytes=end - start)
    return tensors


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint: the index's shards, or ``*.safetensors`` at root.

    Subdirectories (``adapters/<name>/`` in the artifact layout) are not part of the base model.
    """
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: not a directory")
    index_path = model_dir / INDEX_FILE
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise CheckpointError(f"{index_path}: no 'weight_map' object") from error
        names = sorted(set(weight_map.values()))
        missing = [name for name in names if not (model_dir / name).is_file()]
        if missing:
            raise CheckpointError(f"{index_path}: shards missing: {', '.join(missing)}")
        return [model_dir / name for name in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"{model_dir}: no *.safetensors weights (a .bin/.pt checkpoint is not measured; "
            "save it with safe_serialization)"
        )
    return files


@dataclass(frozen=True)
class CheckpointWeights:
    """Weight memory of a checkpoint: exact tensor bytes, and bytes on disk."""

    model_dir: str
    files: tuple[str, ...]
    num_tensors: int
    tensor_bytes: int
    file_bytes: int
    bytes_by_dtype: dict[str, int]

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return dict(self.__dict__)


def measure_checkpoint_weights(model_dir: Path) -> CheckpointWeights:
    """Sum the tensor bytes of every weight file of ``model_dir``."""
    files = weight_files(model_dir)
    by_dtype: Counter[str] = Counter()
    num_tensors = 0
    for path in files:
        for tensor in read_safetensors_header(path).values():
            by_dtype[tensor.dtype] += tensor.nbytes
            num_tensors += 1
    return CheckpointWeights(
        model_dir=str(model_dir),
        files=tuple(path.name for path in files),
        num_tensors=num_tensors,
        tensor_bytes=sum(by_dtype.values()),
        file_bytes=sum(path.stat().st_size for path in files),
        bytes_by_dtype=dict(sorted(by_dtype.items())),
    )


def memory_reduction(baseline_bytes: int, quantized_bytes: int) -> float:
    """Fraction of weight memory saved: 1 − quantized / baseline (0.68 = 68 % smaller)."""
    if baseline_bytes <= 0:
        raise CheckpointError(f"baseline_bytes: {baseline_bytes} is not a weight size")
    return 1.0 - quantized_bytes / baseline_bytes


# --- quantization format ---------------------------------------------------------------------


@dataclass(frozen=True)
class QuantizationFormat:
    """The weight quantization a checkpoint declares in ``config.json``."""

    quant_method: str
    bits: int
    group_size: int | None
    symmetric: bool
    packing: str
    ignored_modules: tuple[str, ...]


def load_model_config(model_dir: Path) -> dict[str, Any]:
    """Read ``config.json`` of a model directory."""
    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise CheckpointError(f"{path}: missing (not a Hugging Face model directory)") from error
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path}: not valid JSON ({error.msg})") from error
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return config


def read_quantization_format(config: Mapping[str, Any]) -> QuantizationFormat | None:
    """The declared weight quantization, or None for an unquantized checkpoint."""
    qconfig = config.get("quantization_config")
    if qconfig is None:
        return None
    if not isinstance(qconfig, Mapping):
        raise CheckpointError("config.json: 'quantization_config' is not an object")
    method = qconfig.get("quant_method")
    if method == "compressed-tensors":
        groups = qconfig.get("config_groups") or {}
        weight_groups = [
            group for group in groups.values()
            if isinstance(group, Mapping) and isinstance(group.get("weights"), Mapping)
        ]  # fmt: skip
        if not weight_groups:
            raise CheckpointError("config.json: compressed-tensors config has no weight group")
        weights = weight_groups[0]["weights"]
        return QuantizationFormat(
            quant_method=method,
            bits=int(weights["num_bits"]),
            group_size=weights.get("group_size"),
            symmetric=bool(weights.get("symmetric", True)),
            packing=str(weight_groups[0].get("format") or qconfig.get("format")),
            ignored_modules=tuple(qconfig.get("ignore") or ()),
        )
    if method == "awq":
        return QuantizationFormat(
            quant_method=method,
            bits=int(qconfig["bits"]),
            group_size=qconfig.get("group_size"),
            symmetric=not bool(qconfig.get("zero_point", True)),
            packing=f"awq-{qconfig.get('version', 'gemm')}",
            ignored_modules=tuple(qconfig.get("modules_to_not_convert") or ()),
        )
    raise CheckpointError(
        f"config.json: quant_method {method!r} is not one this job writes "
        "(accepted: compressed-tensors, awq)"
    )
