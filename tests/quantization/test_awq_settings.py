"""The quantizer's settings, backend registry and output verification (main environment)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantization.awq import (
    BACKENDS,
    AwqSettings,
    BackendUnavailable,
    main,
    verify_quantized_checkpoint,
)
from quantization.checkpoint import CheckpointError


def test_settings_accept_the_two_group_sizes_and_known_backends() -> None:
    assert AwqSettings().group_size == 128
    assert AwqSettings().backend == "llm-compressor"
    assert AwqSettings(group_size=64, backend="autoawq").ignore == ("lm_head",)
    with pytest.raises(
        ValueError, match=r"group_size: 32 is not accepted; use 128 \(default\) or 64"
    ):
        AwqSettings(group_size=32)
    with pytest.raises(
        ValueError, match="backend: 'gptq' is not accepted; use llm-compressor or autoawq"
    ):
        AwqSettings(backend="gptq")
    assert set(BACKENDS) == {"llm-compressor", "autoawq"}


def test_main_environment_cannot_quantize_and_says_where_to_run(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # llm-compressor is deliberately absent from the main venv (it pins transformers <= 5.17).
    with pytest.raises(BackendUnavailable, match="llmcompressor is not installed here"):
        BACKENDS["llm-compressor"].quantize(tiny_model_dir, None, AwqSettings(), tmp_path, print)  # type: ignore[arg-type]
    code = main(["--model-dir", str(tiny_model_dir), "--output-dir", str(tmp_path / "out")])
    assert code == 2
    assert "run in the quantization environment" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_output_directory_is_not_overwritten_by_accident(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    from quantization.awq import _prepare_output_dir

    with pytest.raises(ValueError, match="is not empty; pass --overwrite"):
        _prepare_output_dir(out, overwrite=False)
    _prepare_output_dir(out, overwrite=True)
    assert list(out.iterdir()) == []


def _write_config(directory: Path, quantization_config: dict[str, object] | None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config: dict[str, object] = {"model_type": "llama"}
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_verification_refuses_a_checkpoint_that_is_not_what_was_asked(tmp_path: Path) -> None:
    awq_g128 = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    assert verify_quantized_checkpoint(_write_config(tmp_path / "a", awq_g128), AwqSettings()) == (
        "awq",
        128,
    )
    with pytest.raises(CheckpointError, match="declares 4-bit group 128, expected 4-bit group 64"):
        verify_quantized_checkpoint(tmp_path / "a", AwqSettings(group_size=64))
    with pytest.raises(CheckpointError, match="no quantization_config was written"):
        verify_quantized_checkpoint(_write_config(tmp_path / "b", None), AwqSettings())


def test_pure_modules_and_the_clis_import_no_ml_library() -> None:
    import subprocess
    import sys

    script = (
        "import sys\n"
        "import prompts, quantization.calibration, quantization.scoring\n"
        "import quantization.gate, quantization.checkpoint, quantization.evaluate, quantization.awq\n"
        "heavy = {'torch', 'transformers', 'llmcompressor', 'awq', 'vllm', 'datasets'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert result.stdout.strip() == "[]"
