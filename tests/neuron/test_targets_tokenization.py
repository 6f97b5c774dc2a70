"""Targets, sample queries, fixed-shape tokenization and the random model builder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from intents import INTENT_LABELS
from neuron.runtime import SdkUnavailableError, load_sdk, neuron_device_paths
from neuron.samples import LONG_QUERY, SAMPLE_QUERIES, parity_texts, texts_for_batch
from neuron.targets import CompileTarget, parse_target, profile, sdk_missing_message
from neuron.tokenization import encode_fixed, load_fixed_length_tokenizer


def test_targets_and_their_profiles() -> None:
    assert [t.value for t in CompileTarget] == ["inf1", "inf2", "cpu"]
    assert profile("inf1").runtime_module == "torch_neuron"
    assert profile(CompileTarget.INF2).runtime_module == "torch_neuronx"
    assert profile("cpu").runtime_module is None
    assert profile("inf1").neuron_cores_per_device == 4  # inf1.xlarge: 1 chip, 4 NeuronCores
    assert "sdk2.20.2" in profile("inf1").image
    assert "py310" in profile("inf1").image
    assert "neuronx" in profile("inf2").image
    assert "py311" in profile("inf2").image
    with pytest.raises(ValueError, match="accepted: inf1, inf2, cpu"):
        parse_target("gpu")


def test_missing_sdk_message_names_module_and_image() -> None:
    message = sdk_missing_message(CompileTarget.INF2, "module torch_neuronx is not installed")
    assert "torch-neuronx" in message
    assert profile("inf2").image in message
    with pytest.raises(SdkUnavailableError, match="torch_neuron"):
        load_sdk(CompileTarget.INF1)
    assert load_sdk(CompileTarget.CPU) is None


def test_neuron_devices_are_found_by_name(tmp_path: Path) -> None:
    for name in ("neuron0", "neuron1", "null", "neuron_monitor"):
        (tmp_path / name).touch()
    assert [Path(p).name for p in neuron_device_paths(str(tmp_path))] == ["neuron0", "neuron1"]


def test_samples_cover_every_intent_in_two_languages() -> None:
    assert {intent for _, intent in SAMPLE_QUERIES} == set(INTENT_LABELS)
    assert any(any("\u3040" <= ch <= "\u30ff" for ch in text) for text, _ in SAMPLE_QUERIES)
    assert parity_texts()[-1] == LONG_QUERY
    assert texts_for_batch(3, offset=len(parity_texts()) - 1)[1:] == parity_texts()[:2]


def test_fixed_shape_tokenization_pads_truncates_and_says_so(tiny_model_dir: Path) -> None:
    tokenizer = load_fixed_length_tokenizer(tiny_model_dir / "tokenizer.json",
                                            max_length=128, pad_id=0)
    batch = encode_fixed(tokenizer, ["What manga is similar to Naruto?", LONG_QUERY, "漫画"])
    assert [len(row) for row in batch.input_ids] == [128, 128, 128]
    assert [len(row) for row in batch.attention_mask] == [128, 128, 128]
    assert batch.truncated == [False, True, False]
    assert batch.token_counts[1] == 128
    assert batch.token_counts[0] < 20
    assert batch.input_ids[0][batch.token_counts[0]:] == [0] * (128 - batch.token_counts[0])
    with pytest.raises(ValueError, match="pad_token_id"):
        load_fixed_length_tokenizer(tiny_model_dir / "tokenizer.json", max_length=128,
                                    pad_id=10**6)


def test_random_model_is_a_labelled_distilbert(tiny_model_dir: Path) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["model_type"] == "distilbert"
    assert [config["id2label"][str(i)] for i in range(8)] == list(INTENT_LABELS)
    assert (tiny_model_dir / "tokenizer.json").is_file()


def test_random_model_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from neuron import random_model

    assert random_model.main([str(tmp_path / "m"), "--size", "tiny", "--seed", "3"]) == 0
    assert "written to" in capsys.readouterr().out
    assert (tmp_path / "m" / "model.safetensors").is_file()
    with pytest.raises(ValueError, match="size"):
        random_model.build_random_distilbert(tmp_path / "x", size="huge")
