"""Model artifacts as `make publish` receives them, small enough for tests.

* :func:`write_model_dir` — a W4A16 (compressed-tensors) checkpoint directory with the planned
  model's architecture (config/models/llama-3-8b-instruct.json), its tokenizer files and one
  safetensors file of a chosen size;
* :func:`write_adapters` — one folder per configured adapter with adapter_config.json;
* :func:`write_intent_archive` — a model.tar.gz laid out as neuron/compile.py writes it
  (manifest.json for a target, labels, artifact-manifest.json).

moto's account they are published to is :func:`tests.support.aws.aws_environment`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from artifact_manifest import MANIFEST_FILE, describe_files, list_artifact_files
from intents import INTENT_LABELS
from neuron.manifest import ArtifactManifest
from neuron.model_archive import build_model_tar, files_digest_map
from neuron.targets import CompileTarget
from stacks.settings import REPO_ROOT

BASE_MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"
W4A16_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"], "format": "pack-quantized",
                                  "weights": {"num_bits": 4, "group_size": 128,
                                              "symmetric": False, "strategy": "group"}}},
    "ignore": ["lm_head"],
}
DEV_ADAPTERS = {"manga_domain": 64, "general_support": 64, "jp_translation": 32}


def write_model_dir(root: Path, *, weights_bytes: int = 1024,
                    quantization: Mapping[str, Any] | None = W4A16_CONFIG,
                    config_changes: Mapping[str, Any] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    config = json.loads((REPO_ROOT / "config/models/llama-3-8b-instruct.json").read_text())
    if quantization is not None:
        config["quantization_config"] = dict(quantization)
    config.update(config_changes or {})
    (root / "config.json").write_text(json.dumps(config))
    (root / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    (root / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    (root / "generation_config.json").write_text('{"eos_token_id": 128009}')
    with (root / "model.safetensors").open("wb") as handle:
        block = bytes(range(256)) * 4096  # 1 MiB, not all zeros
        remaining = weights_bytes
        while remaining > 0:
            handle.write(block[:remaining])
            remaining -= len(block)
    return root


def write_adapters(root: Path, ranks: Mapping[str, int] = DEV_ADAPTERS, *,
                   base_model: str = BASE_MODEL) -> Path:
    for folder, rank in ranks.items():
        adapter = root / folder
        adapter.mkdir(parents=True, exist_ok=True)
        (adapter / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
            "base_model_name_or_path": base_model,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}))
        (adapter / "adapter_model.safetensors").write_bytes(f"lora-{folder}-{rank}".encode() * 64)
    return root


def write_intent_archive(out: Path, *, target: str = "inf1") -> Path:
    """model.tar.gz as neuron/compile.py lays it out (stand-in TorchScript bytes)."""
    artifact = out / "model"
    artifact.mkdir(parents=True, exist_ok=True)
    (artifact / "model-b1.pt").write_bytes(b"torchscript stand-in " * 100)
    (artifact / "tokenizer.json").write_text('{"model": {"type": "WordPiece"}}')
    (artifact / "labels.json").write_text(json.dumps(list(INTENT_LABELS)))
    manifest = ArtifactManifest(
        target=CompileTarget(target), labels=tuple(INTENT_LABELS), max_seq_length=128,
        batch_sizes=(1,), model_files={1: "model-b1.pt"}, pad_token_id=0, pipeline_cores=1,
        compiler="neuron-cc (torch_neuron.trace)", versions={"torch": "1.13.1"}, parity=None,
        latency={}, files_sha256=files_digest_map(artifact, ["model-b1.pt", "tokenizer.json",
                                                             "labels.json"]),
        source_model="distilbert-manga-intent", created_unix_s=0,
        notes=("compiled with --skip-device-checks: parity and latency were not measured",))
    (artifact / "manifest.json").write_text(manifest.to_json())
    (artifact / MANIFEST_FILE).write_text(
        describe_files(artifact, list_artifact_files(artifact)).to_json())
    build_model_tar(artifact, out / "model.tar.gz")
    return out / "model.tar.gz"
