"""Real AWQ on a tiny random Llama, on the CPU, with the real libraries.

llm-compressor 0.14 pins compressed-tensors 0.19 and transformers ≤ 5.17, so it cannot share the
main test environment (vLLM 0.33 / transformers 5.23): these tests run the CLIs with the
quantization environment's interpreter (``.venv-quant``, or ``$MANGAASSIST_QUANT_PYTHON``) and
are skipped only when that environment does not exist. The tiny model is built here, in the main
environment, with Llama-3's special tokens and chat template.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from artifact_manifest import MANIFEST_FILE, artifact_files_from_json, find_mismatch
from quantization.checkpoint import (
    load_model_config,
    measure_checkpoint_weights,
    read_quantization_format,
    read_safetensors_header,
)
from tests.support.quantize_job import run_job as _run_job

REPO_ROOT = Path(__file__).resolve().parents[2]
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

pytestmark = pytest.mark.slow


def _run(python: Path, *args: str, timeout_s: int = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), *args], cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=timeout_s, check=False,
    )  # fmt: skip


def _quantize(
    python: Path, model_dir: Path, out: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    # A --max-seq-len in extra comes later and wins (argparse keeps the last value).
    command = ["-m", "quantization.awq", "--model-dir", str(model_dir), "--output-dir", str(out)]
    result = _run(python, *command, "--max-seq-len", "256", *extra)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _linear_bytes(model_dir: Path) -> dict[str, int]:
    """Bytes each decoder Linear occupies, whatever tensors its format stores it as."""
    (weights_file,) = model_dir.glob("*.safetensors")
    totals: dict[str, int] = {}
    for name, tensor in read_safetensors_header(weights_file).items():
        module = name.rsplit(".", 1)[0]
        if module.endswith(LINEAR_NAMES):
            totals[module] = totals.get(module, 0) + tensor.nbytes
    return totals


@pytest.fixture(scope="module")
def failed_job(
    quant_python: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    """The whole job (quantize, gate, upload) on the tiny model, with the default thresholds."""
    work = tmp_path_factory.mktemp("job-default-gate")
    result, aws_log = _run_job(quant_python, tiny_model_dir, work)
    return result, aws_log, work


@pytest.fixture(scope="module")
def llm_compressor_g128(
    failed_job: tuple[subprocess.CompletedProcess[str], Path, Path],
) -> tuple[Path, str]:
    """The checkpoint the job quantized with the default backend and group size."""
    result, _, work = failed_job
    assert (work / "quantized" / "config.json").is_file(), result.stderr[-3000:]
    return work / "quantized", result.stdout


@pytest.mark.budget(reason="the module's failed_job (the whole job on the tiny model: AWQ on CPU, the quality gate, the upload) lands in its setup: 63 s beside the suite on a two-core machine without AVX-512")
def test_llm_compressor_writes_a_vllm_loadable_w4a16_checkpoint(
    llm_compressor_g128: tuple[Path, str], tiny_model_dir: Path
) -> None:
    out, stdout = llm_compressor_g128
    declared = read_quantization_format(load_model_config(out))
    assert declared is not None
    assert declared.quant_method == "compressed-tensors"  # what vLLM's loader dispatches on
    assert (declared.bits, declared.group_size, declared.symmetric) == (4, 128, False)
    assert declared.packing == "pack-quantized"
    assert declared.ignored_modules == ("lm_head",)
    # Packed: every decoder Linear stores int32-packed weights plus scales and zero points.
    header = read_safetensors_header(next(out.glob("*.safetensors")))
    down = "model.layers.0.mlp.down_proj"
    assert header[f"{down}.weight_packed"].dtype == "I32"
    assert header[f"{down}.weight_packed"].shape == (256, 512 // 8)  # eight 4-bit values per int32
    assert header[f"{down}.weight_scale"].shape == (256, 512 // 128)  # one scale per group
    assert f"{down}.weight" not in header
    assert header["lm_head.weight"].dtype == "BF16"  # left unquantized
    baseline, quantized = _linear_bytes(tiny_model_dir), _linear_bytes(out)
    assert baseline.keys() == quantized.keys()
    assert len(baseline) == 14
    for module, size in quantized.items():
        assert size < 0.3 * baseline[module], module  # 4/16 of the bits + group metadata
    # The tokenizer and chat template travel with the weights.
    assert (out / "tokenizer.json").is_file()
    assert (out / "chat_template.jinja").is_file()
    manifest = json.loads((out / "quantization_manifest.json").read_text(encoding="utf-8"))
    assert manifest["backend"] == "llm-compressor"
    assert manifest["device"] == "cpu"
    assert manifest["calibration"]["num_samples"] == 4
    assert manifest["quantized_weight_bytes"] == measure_checkpoint_weights(out).tensor_bytes
    assert manifest["baseline_weight_bytes"] > manifest["quantized_weight_bytes"]
    for step in range(1, 6):
        assert f"[quantize] {step}/5" in stdout  # progress


def test_quantized_model_loads_runs_and_stays_close_to_the_baseline(
    llm_compressor_g128: tuple[Path, str], tiny_model_dir: Path, quant_python: Path
) -> None:
    # transformers + compressed-tensors load the packed checkpoint (as the gate's generator
    # does); its logits must stay close to, but not equal, the bf16 model's.
    script = (
        "import sys, torch\n"
        "from transformers import AutoModelForCausalLM\n"
        "base = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)\n"
        "quant = AutoModelForCausalLM.from_pretrained(sys.argv[2], dtype=torch.float32)\n"
        "ids = torch.tensor([[0, 10, 20, 30, 40, 50, 60, 70]])\n"
        "with torch.no_grad():\n"
        "    a, b = base(ids).logits, quant(ids).logits\n"
        "cos = torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0)\n"
        "print(f'COSINE {cos.item():.4f}')\n"
    )
    result = _run(quant_python, "-c", script, str(tiny_model_dir), str(llm_compressor_g128[0]))
    assert result.returncode == 0, result.stderr[-3000:]
    cosine = float(result.stdout.split("COSINE")[-1])
    assert 0.9 < cosine < 1.0


def test_group_size_64_is_the_higher_quality_option(
    quant_python: Path, tiny_model_dir: Path, tmp_path: Path, llm_compressor_g128: tuple[Path, str]
) -> None:
    out = tmp_path / "g64"
    dump = tmp_path / "calibration.jsonl"
    _quantize(
        quant_python, tiny_model_dir, out, "--num-samples", "4", "--max-seq-len", "128",
        "--group-size", "64", "--dump-calibration", str(dump),
    )  # fmt: skip
    declared = read_quantization_format(load_model_config(out))
    assert declared is not None
    assert declared.group_size == 64
    rows = [json.loads(line) for line in dump.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 4
    assert all(row["text"].startswith("<|begin_of_text|><|start_header_id|>system") for row in rows)
    g64 = sum(_linear_bytes(out).values())
    g128 = sum(_linear_bytes(llm_compressor_g128[0]).values())
    assert g128 < g64 < 1.1 * g128  # twice the scales and zero points, same packed weights


def test_autoawq_backend_behind_the_same_interface(
    quant_python: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "autoawq"
    result = _quantize(
        quant_python, tiny_model_dir, out, "--num-samples", "4", "--max-seq-len", "64",
        "--backend", "autoawq",
    )  # fmt: skip
    assert "[quantize] 3/5 AWQ with autoawq 0.2.9" in result.stdout
    declared = read_quantization_format(load_model_config(out))
    assert declared is not None
    assert (declared.quant_method, declared.bits, declared.group_size) == ("awq", 4, 128)
    header = read_safetensors_header(next(out.glob("*.safetensors")))
    assert header["model.layers.0.mlp.down_proj.qweight"].dtype == "I32"
    assert all(size < 0.3 * base for size, base in zip(
        _linear_bytes(out).values(), _linear_bytes(tiny_model_dir).values(), strict=True))  # fmt: skip


def test_bad_input_is_one_line_and_exit_2(
    quant_python: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    result = _run(
        quant_python, "-m", "quantization.awq", "--model-dir", str(tiny_model_dir),
        "--output-dir", str(tmp_path / "x"), "--group-size", "32",
    )  # fmt: skip
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("error: group_size: 32 is not accepted; use 128 (default) or 64")
    )


REPORT_UPLOAD = ["s3", "cp", "{gate}/", "s3://artifacts-bucket/quantization/runs/job-1/",
                 "--recursive", "--exclude", "*", "--include", "quality_gate.json",
                 "--include", "quality_gate.md", "--only-show-errors"]


def test_job_fails_on_the_gate_says_why_and_uploads_only_the_reports(
    failed_job: tuple[subprocess.CompletedProcess[str], Path, Path],
) -> None:
    # Real generation with transformers on both checkpoints: a random model answers gibberish,
    # so the gate fails, the job exits non-zero with the reasons, and nothing is uploaded.
    result, aws_log, tmp_path = failed_job
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    reason = (tmp_path / "failure").read_text(encoding="utf-8")
    assert reason.startswith("quality gate failed (exit 1): - **score_overall**")
    assert "**memory_reduction**" in reason  # a tiny model is mostly embeddings
    report = json.loads((tmp_path / "gate" / "quality_gate.json").read_text(encoding="utf-8"))
    assert {"score_overall", "score_ja", "score_en"} <= set(report["failed_checks"])
    assert len(report["quantized"]["items"]) == 50
    assert "[evaluate] quantized: 50/50 prompts" in result.stderr
    # The verdict is published for the launcher; the model is not uploaded.
    upload = [part.replace("{gate}", str(tmp_path / "gate")) for part in REPORT_UPLOAD]
    assert aws_log.read_text().split() == upload


@pytest.mark.budget(reason="the session's passing_job (tests/quantization/conftest.py: the whole job on the taught model: AWQ on CPU, the quality gate over the base and both adapters, the upload) lands in the setup of the first test that asks for it on its worker: 48-60 s beside the suite")
def test_job_uploads_a_passing_checkpoint_as_a_candidate_with_its_manifest(
    passing_job: tuple[subprocess.CompletedProcess[str], Path, Path],
) -> None:
    """A passing run uploads a candidate to its own prefix (ARTIFACT_S3_URI, the launcher's
    <candidates_prefix>/<run id>/), never the served one: every file with its SHA-256 in its
    metadata, then artifact-manifest.json, which lists each of them. The run: the taught tiny
    model and its two adapters (tests/quantization/conftest.py), which meet the default score
    and regression thresholds (tests/quantization/test_adapter_gate_cpu.py)."""
    result, aws_log, tmp_path = passing_job
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    sse = ["--sse", "aws:kms", "--sse-kms-key-id", "alias/artifacts"]
    calls = [line.split() for line in aws_log.read_text().splitlines()]
    assert calls[0] == [*(part.replace("{gate}", str(tmp_path / "gate"))
                          for part in REPORT_UPLOAD), *sse]
    quantized = tmp_path / "quantized"
    manifest = artifact_files_from_json((quantized / MANIFEST_FILE).read_text())
    assert find_mismatch(quantized, manifest) is None
    assert {"config.json", "quality_gate.json", "quality_gate.md", "tokenizer.json"} <= set(
        manifest.files)
    candidate = "s3://artifacts-bucket/quantization/models/job-1"
    assert calls[1:-1] == [
        ["s3", "cp", f"{quantized}/{name}", f"{candidate}/{name}",
         "--metadata", f"sha256={manifest.files[name].sha256}", "--only-show-errors", *sse]
        for name in sorted(manifest.files)]
    manifest_digest = hashlib.sha256((quantized / MANIFEST_FILE).read_bytes()).hexdigest()
    assert calls[-1] == ["s3", "cp", f"{quantized}/{MANIFEST_FILE}", f"{candidate}/{MANIFEST_FILE}",
                         "--metadata", f"sha256={manifest_digest}", "--content-type",
                         "application/json", "--only-show-errors", *sse]
    assert not any("sync" in call or "models/llama-3-8b-instruct-awq" in " ".join(call)
                   for call in calls)
    assert not (tmp_path / "failure").exists()


def test_the_cpu_workaround_is_still_needed(quant_python: Path, tiny_model_dir: Path) -> None:
    # Evidence for quantization/awq.py's _cpu_pinned_memory_workaround: without it,
    # llm-compressor 0.14.0.1's AWQ fails on a CPU-only machine. When this test starts failing,
    # the upstream bug is fixed and the workaround can go.
    script = (
        "import sys, torch\n"
        "from datasets import Dataset\n"
        "from transformers import AutoModelForCausalLM\n"
        "from llmcompressor import oneshot\n"
        "from llmcompressor.modifiers.quantization import QuantizationModifier\n"
        "from llmcompressor.modifiers.transform.awq import AWQModifier\n"
        "assert not torch.accelerator.is_available()\n"
        "model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype='auto')\n"
        "ids = list(range(5, 69))\n"
        "data = Dataset.from_dict({'input_ids': [ids], 'attention_mask': [[1] * len(ids)]})\n"
        "recipe = [AWQModifier(), QuantizationModifier(scheme='W4A16_ASYM', targets=['Linear'],\n"
        "          ignore=['lm_head'])]\n"
        "try:\n"
        "    oneshot(model=model, dataset=data, recipe=recipe, num_calibration_samples=1)\n"
        "except RuntimeError as error:\n"
        "    print('ERROR', error)\n"
    )
    result = _run(quant_python, "-c", script, str(tiny_model_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ERROR Cannot access accelerator device when none is available." in result.stdout
