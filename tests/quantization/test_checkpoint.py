"""Checkpoint weight bytes (safetensors headers) and declared quantization formats."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from quantization.checkpoint import (
    CheckpointError,
    measure_checkpoint_weights,
    memory_reduction,
    read_quantization_format,
    read_safetensors_header,
)


def test_reads_exact_tensor_bytes_from_real_safetensors(tmp_path: Path) -> None:
    save_file(
        {
            "a": torch.zeros(3, 5, dtype=torch.bfloat16),
            "b": torch.zeros(7, dtype=torch.int32),
            "c": torch.zeros(2, 2, dtype=torch.float64),
        },
        str(tmp_path / "model.safetensors"),
    )
    header = read_safetensors_header(tmp_path / "model.safetensors")
    assert {name: (t.dtype, t.shape, t.nbytes) for name, t in header.items()} == {
        "a": ("BF16", (3, 5), 30),
        "b": ("I32", (7,), 28),
        "c": ("F64", (2, 2), 32),
    }
    weights = measure_checkpoint_weights(tmp_path)
    assert weights.tensor_bytes == 90
    assert weights.num_tensors == 3
    assert weights.bytes_by_dtype == {"BF16": 30, "F64": 32, "I32": 28}
    assert weights.file_bytes == (tmp_path / "model.safetensors").stat().st_size > 90


def test_sharded_checkpoints_follow_the_index_and_ignore_subdirectories(tmp_path: Path) -> None:
    save_file({"x": torch.zeros(10, dtype=torch.float16)}, str(tmp_path / "model-1.safetensors"))
    save_file({"y": torch.zeros(6, dtype=torch.float16)}, str(tmp_path / "model-2.safetensors"))
    (tmp_path / "adapters" / "manga").mkdir(parents=True)
    save_file({"lora": torch.zeros(100)}, str(tmp_path / "adapters" / "manga" / "a.safetensors"))
    index = {"weight_map": {"x": "model-1.safetensors", "y": "model-2.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert measure_checkpoint_weights(tmp_path).tensor_bytes == 32
    (tmp_path / "model-2.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"shards missing: model-2\.safetensors"):
        measure_checkpoint_weights(tmp_path)


def test_malformed_files_are_refused_with_the_reason(tmp_path: Path) -> None:
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01")
    with pytest.raises(CheckpointError, match="too short"):
        read_safetensors_header(short)
    lying = tmp_path / "lying.safetensors"
    body = json.dumps({"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 8]}}).encode()
    lying.write_bytes(struct.pack("<Q", len(body)) + body + b"\0" * 8)
    with pytest.raises(
        CheckpointError, match=r"tensor 'w' spans 8 bytes but BF16\[4, 4\] needs 32"
    ):
        read_safetensors_header(lying)
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes(struct.pack("<Q", 2**40))
    with pytest.raises(CheckpointError, match="not plausible"):
        read_safetensors_header(huge)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors weights"):
        measure_checkpoint_weights(empty)


def test_memory_reduction() -> None:
    assert memory_reduction(16_060, 5_200) == pytest.approx(0.676, abs=1e-3)
    with pytest.raises(CheckpointError, match="baseline_bytes: 0"):
        memory_reduction(0, 1)


def test_reads_both_quantization_formats_vllm_loads() -> None:
    compressed = {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "ignore": ["lm_head"],
            "config_groups": {
                "group_0": {
                    "format": "pack-quantized",
                    "targets": ["Linear"],
                    "weights": {"num_bits": 4, "group_size": 64, "symmetric": False},
                }
            },
        }
    }
    declared = read_quantization_format(compressed)
    assert declared is not None
    assert (declared.quant_method, declared.bits, declared.group_size) == (
        "compressed-tensors", 4, 64
    )  # fmt: skip
    assert (declared.symmetric, declared.packing, declared.ignored_modules) == (
        False, "pack-quantized", ("lm_head",)
    )  # fmt: skip
    autoawq = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128,
                                       "zero_point": True, "version": "gemm"}}  # fmt: skip
    declared = read_quantization_format(autoawq)
    assert declared is not None
    assert (declared.bits, declared.group_size, declared.symmetric, declared.packing) == (
        4, 128, False, "awq-gemm"
    )  # fmt: skip
    assert read_quantization_format({"model_type": "llama"}) is None
    with pytest.raises(CheckpointError, match="quant_method 'gptq' is not one this job writes"):
        read_quantization_format({"quantization_config": {"quant_method": "gptq"}})
