"""The GPU smoke test's Python steps that need no GPU: the adapter made from config.json's shapes
alone, vLLM's server arguments from the ENGINE_* settings, the side-by-side table, and writing a
profile into the decode-speed table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.gpu_smoke_report import comparison, write_adapter, write_profile

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_adapter_is_shaped_from_config_json(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2}))
    names = write_adapter(model, tmp_path / "adapter")
    tensors = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert len(names) == 8 and set(tensors) == set(names)
    prefix = "base_model.model.model.layers.1.self_attn"
    assert tuple(tensors[f"{prefix}.q_proj.lora_A.weight"].shape) == (8, 64)
    assert tuple(tensors[f"{prefix}.q_proj.lora_B.weight"].shape) == (64, 8)
    assert tuple(tensors[f"{prefix}.v_proj.lora_B.weight"].shape) == (32, 8)  # 2 KV heads x 16
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["target_modules"] == ["q_proj", "v_proj"]


def point(batch: int, ttft: float, tpot: float) -> dict[str, object]:
    return {"batch_size": batch, "ttft_ms": {"p50": ttft, "p99": ttft},
            "tpot_ms": {"p50": tpot, "p99": tpot}, "status": "measured", "source": "x"}


def test_the_two_profiles_side_by_side_with_their_ratio() -> None:
    rows = comparison({"points": [point(1, 120.0, 10.0), point(8, 200.0, 12.0)]},
                      {"points": [point(1, 100.0, 10.0)]})
    assert rows[1:] == ["1 | 120.0 | 100.0 | 1.20x | 10.0 | 10.0 | 1.00x"]


def test_a_profile_is_written_into_the_table_and_checked(tmp_path: Path) -> None:
    table = tmp_path / "decode_speed.json"
    table.write_text((REPO_ROOT / "config" / "decode_speed.json").read_text())
    profile = {"gpu": "NVIDIA H200", "model": "smoke", "quantization": "bf16",
               "kv_cache_dtype": "auto", "prompt_tokens": 900, "output_tokens": 190,
               "points": [point(1, 50.0, 8.0)]}
    (tmp_path / "p.json").write_text(json.dumps(profile))
    assert write_profile(tmp_path / "p.json", table) == 0
    written = json.loads(table.read_text())
    h200 = next(p for p in written["profiles"] if p["gpu"] == "NVIDIA H200")
    assert h200["points"][0]["ttft_ms"]["p50"] == 50.0
    (tmp_path / "p.json").write_text(json.dumps({**profile, "points": "x"}))
    with pytest.raises(ValueError, match="points"):
        write_profile(tmp_path / "p.json", table)
