"""The per-adapter gate through the real pipeline on the CPU: a tiny Llama taught a greeting, two
LoRA adapters taught their own tasks (tests/support/tiny_lora.py), AWQ with llm-compressor, and
the gate generating with transformers on both checkpoints, adapters applied to each.

The job (containers/quantize/quantize-job) gates the base and each adapter with the default score
and regression thresholds and writes a candidate whose manifest names the adapters by checksum;
the same checkpoint with one adapter's weights scaled down fails, while the base passes.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from artifact_manifest import MANIFEST_FILE, adapter_dir_checksum, artifact_files_from_json
from prompts import MANGAASSIST_SYSTEM_PROMPT
from quantization.calibration import ChatMessage
from tests.quantization.conftest import GATE_MAX_NEW_TOKENS, MANGA, SUPPORT
from tests.support.quantize_job import REPO_ROOT
from tests.support.tiny_lora import scaled_copy

pytestmark = pytest.mark.slow


def test_each_adapter_answers_its_own_task_not_the_bases(taught_model: Path) -> None:
    """What makes a broken adapter visible: on its prompts, the base alone scores 0 and the base
    with the adapter 5 (real transformers generation, adapter applied by the gate's code)."""
    from quantization.generation import TransformersChatGenerator

    generator = TransformersChatGenerator(taught_model / "base",
                                          max_new_tokens=int(GATE_MAX_NEW_TOKENS))
    for task, folder in ((SUPPORT, "general_support"), (MANGA, "manga_domain")):
        conversations: list[list[ChatMessage]] = [
            [{"role": "system", "content": MANGAASSIST_SYSTEM_PROMPT},
             {"role": "user", "content": prompt}] for _, _, prompt, _ in task.prompts]
        generator.use_adapter(None, None)
        assert generator.generate(conversations) == ["Welcome!"] * 2
        generator.use_adapter(task.name, taught_model / "adapters" / folder)
        assert generator.generate(conversations) == [task.answer] * 2


@pytest.mark.budget(reason="the session's passing_job (tests/quantization/conftest.py: the whole job on the taught model: AWQ on CPU, the quality gate over the base and both adapters, the upload) lands in the setup of the first test that asks for it on its worker: 48-60 s beside the suite")
def test_the_job_gates_each_adapter_and_names_them_in_the_candidate(
    passing_job: tuple[subprocess.CompletedProcess[str], Path, Path], taught_model: Path
) -> None:
    result, _, work = passing_job
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((work / "gate" / "quality_gate.json").read_text(encoding="utf-8"))
    assert report["passed"] is True and report["base_passed"] is True
    assert list(report["adapters"]) == ["manga", "support"]
    for name, folder in (("manga", "manga_domain"), ("support", "general_support")):
        section = report["adapters"][name]
        assert section["passed"] is True, section["failed_checks"]
        # Default thresholds: score >= 4, regression <= 2 %, in each of the set's languages.
        assert {c["name"] for c in section["checks"]} == {
            "score_overall", "score_ja", "score_en", "regression_overall", "regression_ja",
            "regression_en", "hallucinated_titles"}
        assert section["quantized"]["overall"] == 5.0
        assert section["sha256"] == adapter_dir_checksum(taught_model / "adapters" / folder)
        assert section["directory"] == folder
    assert "[evaluate] quantized+support: 2/2 prompts" in result.stderr
    markdown = (work / "gate" / "quality_gate.md").read_text(encoding="utf-8")
    assert "## Adapter support (fp16 base + adapter vs AWQ base + adapter)" in markdown
    manifest = artifact_files_from_json((work / "quantized" / MANIFEST_FILE).read_text())
    assert {name: (a.directory, a.sha256) for name, a in manifest.adapters.items()} == {
        name: (section["directory"], section["sha256"])
        for name, section in report["adapters"].items()}


def test_a_broken_adapter_fails_the_candidate_while_the_base_passes(
    passing_job: tuple[subprocess.CompletedProcess[str], Path, Path], taught_model: Path,
    quant_python: Path, tmp_path: Path,
) -> None:
    _, _, work = passing_job
    broken = scaled_copy(taught_model / "adapters" / "general_support",
                         tmp_path / "adapters" / "general_support", 0.3)
    result = subprocess.run(
        [str(quant_python), "-m", "quantization.evaluate",
         "--baseline-model", str(taught_model / "base"), "--quantized-model", str(work / "quantized"),
         "--eval-set", str(taught_model / "eval_base.jsonl"),
         "--adapter", f"manga={taught_model / 'adapters' / 'manga_domain'}",
         "--adapter", f"support={broken}",
         "--adapter-eval-set", f"manga={taught_model / 'eval_manga.jsonl'}",
         "--adapter-eval-set", f"support={taught_model / 'eval_support.jsonl'}",
         "--max-new-tokens", GATE_MAX_NEW_TOKENS, "--min-memory-reduction", "0.5",
         "--report-dir", str(tmp_path / "gate")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "gate" / "quality_gate.json").read_text(encoding="utf-8"))
    assert report["base_passed"] is True and report["passed"] is False
    assert report["adapters"]["manga"]["passed"] is True
    support = report["adapters"]["support"]
    assert "score_overall" in support["failed_checks"]
    assert support["quantized"]["overall"] == 0.0
    assert all(check.startswith("support:") for check in report["failed_checks"])
    assert "- **support:score_overall**: measured 0, needs >= 4" in result.stdout
