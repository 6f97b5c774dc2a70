"""Model specs read from config.json, checked against transformers building the real module tree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpu_budget import ModelSpec, ModelSpecError, load_model_spec

MODELS_DIR = Path(__file__).resolve().parents[2] / "config" / "models"
LLAMA_3_8B = MODELS_DIR / "llama-3-8b-instruct.json"
LLAMA_3_70B = MODELS_DIR / "llama-3-70b-instruct.json"
LLAMA_32_1B = MODELS_DIR / "llama-3.2-1b-instruct.json"

QWEN25_05B_CONFIG = {
    # Qwen/Qwen2.5-0.5B-Instruct's config.json (the fields that size memory): exercises the q/k/v
    # bias that Qwen2 always carries and tied embeddings.
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "torch_dtype": "bfloat16",
}



def _transformers_counts(config: dict[str, Any]) -> tuple[int, int]:
    """(parameters, bf16 bytes) of the architecture as transformers builds it on the meta device."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config, torch_dtype=torch.bfloat16)
    params = list(model.parameters())  # tied tensors appear once
    return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (LLAMA_3_8B, 8_030_261_248),
        (LLAMA_32_1B, 1_235_814_400),
        (LLAMA_3_70B, 70_553_706_496),
        (QWEN25_05B_CONFIG, 494_032_768),
    ],
    ids=["llama-3-8b", "llama-3.2-1b", "llama-3-70b", "qwen2.5-0.5b"],
)
def test_parameter_count_matches_transformers_module_tree(source: Any, expected: int) -> None:
    spec = ModelSpec.from_hf_config(source)
    raw = json.loads(Path(source).read_text()) if isinstance(source, Path) else source
    params, bf16_bytes = _transformers_counts(raw)
    assert spec.parameter_count == expected == params
    from gpu_budget import weights_bytes

    assert weights_bytes(spec, "bf16") == bf16_bytes


def test_llama_3_8b_fields(llama8b: ModelSpec) -> None:
    assert llama8b.name == "llama-3-8b-instruct"
    assert (llama8b.num_hidden_layers, llama8b.num_attention_heads, llama8b.num_key_value_heads) == (
        32,
        32,
        8,
    )
    assert llama8b.head_dim == 128  # hidden_size / heads: the config states no head_dim
    assert (llama8b.hidden_size, llama8b.intermediate_size, llama8b.vocab_size) == (
        4096,
        14336,
        128256,
    )
    assert llama8b.tie_word_embeddings is False
    assert llama8b.max_position_embeddings == 8192
    assert llama8b.to_dict()["parameter_count"] == 8_030_261_248


def test_head_dim_taken_from_config_when_present(llama1b: ModelSpec) -> None:
    assert llama1b.head_dim == 64
    assert llama1b.tie_word_embeddings is True
    assert llama1b.max_position_embeddings == 131072


def test_every_shipped_config_loads() -> None:
    names = sorted(path.name for path in MODELS_DIR.glob("*.json"))
    assert names == [
        "llama-3-70b-instruct.json",
        "llama-3-8b-instruct.json",
        "llama-3.2-1b-instruct.json",
    ]
    for path in MODELS_DIR.glob("*.json"):
        assert load_model_spec(path).parameter_count > 0


def test_quantization_config_is_recorded() -> None:
    awq_config = dict(QWEN25_05B_CONFIG)
    awq_config["quantization_config"] = {
        "quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"
    }
    spec = ModelSpec.from_hf_config(awq_config)
    assert (spec.checkpoint_quant_method, spec.checkpoint_quant_bits,
            spec.checkpoint_quant_group_size) == ("awq", 4, 128)
    ct_config = dict(QWEN25_05B_CONFIG)
    ct_config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 64}}},
    }
    spec = ModelSpec.from_hf_config(ct_config)
    assert (spec.checkpoint_quant_method, spec.checkpoint_quant_bits,
            spec.checkpoint_quant_group_size) == ("compressed-tensors", 4, 64)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"architectures": ["MixtralForCausalLM"]}, "not supported; supported: LlamaForCausalLM"),
        ({"num_local_experts": 8}, "mixture-of-experts field 'num_local_experts'"),
        ({"hidden_size": None}, "'hidden_size' must be a positive integer, got None"),
        ({"num_key_value_heads": 5}, "must be a multiple of num_key_value_heads (5)"),
        ({"hidden_size": 1000}, "not divisible by num_attention_heads"),
    ],
)
def test_bad_configs_name_the_field(change: dict[str, Any], message: str) -> None:
    raw = json.loads(LLAMA_3_8B.read_text())
    raw.update(change)
    with pytest.raises(ModelSpecError) as caught:
        ModelSpec.from_hf_config(raw)
    assert message in str(caught.value)


def test_missing_field_is_named() -> None:
    raw = json.loads(LLAMA_3_8B.read_text())
    del raw["vocab_size"]
    with pytest.raises(ModelSpecError, match=r"lacks required field.*vocab_size"):
        ModelSpec.from_hf_config(raw)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ModelSpecError, match="does not exist"):
        load_model_spec(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{ not json")
    with pytest.raises(ModelSpecError, match="not valid JSON"):
        load_model_spec(broken)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ModelSpecError, match="must hold a JSON object"):
        load_model_spec(listed)
