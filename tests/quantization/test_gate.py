"""The quality gate with injected generation: pass, every way to fail, reports and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from prompts import MANGAASSIST_SYSTEM_PROMPT
from quantization.calibration import ChatMessage
from quantization.evaluate import (
    PerConversationGenerator,
    RecordedResponses,
    generate_answers,
    main,
    run_quality_gate,
)
from quantization.gate import GateReport, GateThresholds, MemoryFigures, render_markdown
from quantization.scoring import EvalItem, TitleCatalog

REPO_ROOT = Path(__file__).resolve().parents[2]
SMALLER = MemoryFigures(baseline_bytes=16_060_000_000, quantized_bytes=5_730_000_000)  # −64 %


def good_answer(item: EvalItem) -> str:
    """An answer that contains every required title (marked as the system prompt asks) and term."""
    if item.language == "ja":
        titles = "、".join(f"『{alternatives[0]}』" for alternatives in item.required_titles)
        terms = "、".join(alternatives[0] for alternatives in item.required_terms)
        return f"おすすめは{titles}です。{terms}。"
    titles = ", ".join(f'"{alternatives[0]}"' for alternatives in item.required_titles)
    terms = ", ".join(alternatives[0] for alternatives in item.required_terms)
    return f"I recommend {titles}. {terms}."


def generator_from(
    answer: Callable[[EvalItem], str], items: Sequence[EvalItem]
) -> PerConversationGenerator:
    by_prompt = {item.prompt: item for item in items}

    def generate_one(conversation: Sequence[ChatMessage]) -> str:
        assert conversation[0] == {"role": "system", "content": MANGAASSIST_SYSTEM_PROMPT}
        assert conversation[-1]["role"] == "user"
        return answer(by_prompt[conversation[-1]["content"]])

    return PerConversationGenerator(generate_one)


def gate(
    items: list[EvalItem],
    catalog: TitleCatalog,
    quantized_answer: Callable[[EvalItem], str],
    memory: MemoryFigures = SMALLER,
) -> GateReport:
    return run_quality_gate(
        items,
        catalog,
        baseline=generator_from(good_answer, items),
        quantized=generator_from(quantized_answer, items),
        memory=memory,
        progress=lambda _: None,
    )


def test_passes_when_quality_holds_and_memory_shrinks(
    eval_items: list[EvalItem], catalog: TitleCatalog
) -> None:
    report = gate(eval_items, catalog, good_answer)
    assert report.passed, report.failures
    assert report.quantized.overall == report.quantized.by_language["ja"] == 5.0
    assert report.quantized.items_by_language == {"ja": 25, "en": 25}
    markdown = render_markdown(report)
    assert markdown.startswith("# AWQ quality gate: PASSED")
    assert "64.3 %" in markdown


def test_fails_on_japanese_alone_and_says_so(
    eval_items: list[EvalItem], catalog: TitleCatalog
) -> None:
    def loses_japanese(item: EvalItem) -> str:
        if item.language == "ja" and item.item_id < "ev-ja-14":
            return "わかりません。"  # 13 of 25 Japanese answers lose everything
        return good_answer(item)

    report = gate(eval_items, catalog, loses_japanese)
    assert not report.passed
    failed = {check.name for check in report.failures}
    assert {"score_ja", "regression_ja", "regression_overall"} <= failed
    assert "score_en" not in failed
    assert "regression_en" not in failed
    assert report.quantized.by_language["en"] == 5.0
    assert report.quantized.by_language["ja"] == pytest.approx(5.0 * 12 / 25)
    markdown = render_markdown(report)
    assert "# AWQ quality gate: FAILED" in markdown
    assert "**score_ja**: measured 2.4, needs >= 4" in markdown
    assert "| ev-ja-01 | ja | 0.00 |" in markdown  # the lost answers are listed


def test_fails_on_a_small_regression_even_above_4(
    eval_items: list[EvalItem], catalog: TitleCatalog
) -> None:
    dropped = {"ev-en-04", "ev-en-05"}  # two items lose one of their terms: −2.7 % on English

    def slightly_worse(item: EvalItem) -> str:
        answer = good_answer(item)
        return answer.replace(item.required_terms[0][0], "") if item.item_id in dropped else answer

    report = gate(eval_items, catalog, slightly_worse)
    assert report.quantized.by_language["en"] > 4.0
    assert [check.name for check in report.failures] == ["regression_en"]
    assert report.failures[0].measured == pytest.approx(1 - (23 + 2 * 2 / 3) / 25, abs=1e-4)


def test_one_invented_title_fails_the_gate(
    eval_items: list[EvalItem], catalog: TitleCatalog
) -> None:
    def invents(item: EvalItem) -> str:
        answer = good_answer(item)
        return answer + "『九鬼スピリット』もどうぞ。" if item.item_id == "ev-ja-07" else answer

    report = gate(eval_items, catalog, invents)
    assert [check.name for check in report.failures] == ["hallucinated_titles"]
    assert report.failures[0].detail == "ev-ja-07: 九鬼スピリット"
    assert report.quantized.hallucinations == [("ev-ja-07", "九鬼スピリット")]


def test_fails_when_memory_does_not_shrink_enough(
    eval_items: list[EvalItem], catalog: TitleCatalog
) -> None:
    int8_sized = MemoryFigures(baseline_bytes=16_060_000_000, quantized_bytes=8_200_000_000)
    report = gate(eval_items, catalog, good_answer, memory=int8_sized)
    assert [check.name for check in report.failures] == ["memory_reduction"]
    assert report.failures[0].measured == pytest.approx(1 - 8.2 / 16.06, abs=1e-6)


def test_thresholds_are_validated() -> None:
    with pytest.raises(ValueError, match="min_score: 6 is not on the 0–5 scale"):
        GateThresholds(min_score=6)
    with pytest.raises(ValueError, match=r"min_memory_reduction: 1\.5 must be in"):
        GateThresholds(min_memory_reduction=1.5)


def test_generation_is_batched_with_progress(eval_items: list[EvalItem]) -> None:
    calls: list[int] = []
    lines: list[str] = []

    class CountingGenerator:
        def generate(self, conversations: Sequence[Sequence[ChatMessage]]) -> list[str]:
            calls.append(len(conversations))
            return ["x"] * len(conversations)

    answers = generate_answers(
        "baseline", CountingGenerator(), eval_items, batch_size=16, progress=lines.append
    )
    assert len(answers) == 50
    assert calls == [16, 16, 16, 2]
    assert lines[-1].startswith("[evaluate] baseline: 50/50 prompts")

    class BrokenGenerator:
        def generate(self, conversations: Sequence[Sequence[ChatMessage]]) -> list[str]:
            return []

    with pytest.raises(RuntimeError, match="returned 0 answers for 16 prompts"):
        generate_answers("q", BrokenGenerator(), eval_items, batch_size=16, progress=print)


# --- the CLI, with recorded answers and real safetensors checkpoints --------------------------


def _write_checkpoint(directory: Path, tensors: dict[str, object]) -> Path:
    from safetensors.torch import save_file

    directory.mkdir()
    save_file(tensors, str(directory / "model.safetensors"))  # type: ignore[arg-type]
    return directory


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    import torch

    root = tmp_path_factory.mktemp("checkpoints")
    baseline = _write_checkpoint(
        root / "bf16", {"layer.weight": torch.zeros(1024, 1024, dtype=torch.bfloat16)}
    )
    quantized = _write_checkpoint(
        root / "w4a16",
        {
            "layer.weight_packed": torch.zeros(1024, 128, dtype=torch.int32),
            "layer.weight_scale": torch.zeros(1024, 8, dtype=torch.bfloat16),
        },
    )
    return baseline, quantized


def _responses(path: Path, items: list[EvalItem], answer: Callable[[EvalItem], str]) -> Path:
    path.write_text(
        "\n".join(json.dumps({"id": i.item_id, "response": answer(i)}, ensure_ascii=False)
                  for i in items) + "\n",
        encoding="utf-8",
    )  # fmt: skip
    return path


def test_cli_passes_and_writes_both_reports(
    tmp_path: Path, eval_items: list[EvalItem], checkpoints: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    baseline, quantized = checkpoints
    answers = _responses(tmp_path / "answers.jsonl", eval_items, good_answer)
    code = main([
        "--baseline-model", str(baseline), "--quantized-model", str(quantized),
        "--baseline-responses", str(answers), "--quantized-responses", str(answers),
        "--report-dir", str(tmp_path / "gate"),
    ])  # fmt: skip
    assert code == 0
    report = json.loads((tmp_path / "gate" / "quality_gate.json").read_text(encoding="utf-8"))
    assert report["passed"] is True
    assert report["failed_checks"] == []
    assert report["memory"] == {
        "baseline_weight_bytes": 2 * 1024 * 1024,
        "quantized_weight_bytes": 4 * 1024 * 128 + 2 * 1024 * 8,
        "reduction": pytest.approx(1 - (524288 + 16384) / 2097152, abs=1e-6),
    }
    assert len(report["quantized"]["items"]) == 50
    assert (tmp_path / "gate" / "responses_quantized.jsonl").is_file()
    assert "# AWQ quality gate: PASSED" in capsys.readouterr().out


def test_cli_exit_codes_for_failure_and_bad_input(
    tmp_path: Path, eval_items: list[EvalItem], checkpoints: tuple[Path, Path]
) -> None:
    baseline, quantized = checkpoints
    good = _responses(tmp_path / "good.jsonl", eval_items, good_answer)
    bad = _responses(tmp_path / "bad.jsonl", eval_items, lambda item: "I don't know.")
    command = [
        sys.executable, "-m", "quantization.evaluate",
        "--baseline-model", str(baseline), "--quantized-model", str(quantized),
        "--baseline-responses", str(good), "--report-dir", str(tmp_path / "gate"),
    ]  # fmt: skip
    failed = subprocess.run(
        [*command, "--quantized-responses", str(bad)],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert failed.returncode == 1, failed.stderr
    assert "# AWQ quality gate: FAILED" in failed.stdout
    assert "**score_ja**: measured 0, needs >= 4" in failed.stdout
    assert "[evaluate] quantized: 50/50 prompts" in failed.stderr  # progress
    markdown = (tmp_path / "gate" / "quality_gate.md").read_text(encoding="utf-8")
    assert markdown.startswith("# AWQ quality gate: FAILED")

    partial = tmp_path / "partial.jsonl"
    partial.write_text(good.read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8")
    missing = subprocess.run(
        [*command, "--quantized-responses", str(partial)],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: responses: no answer for item(s) ev-ja-02")
    no_weights = subprocess.run(
        [*command[:4], str(tmp_path), *command[5:], "--quantized-responses", str(good)],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert no_weights.returncode == 2
    assert "no *.safetensors weights" in no_weights.stderr


def test_recorded_responses_refuse_missing_answers(eval_items: list[EvalItem]) -> None:
    with pytest.raises(ValueError, match="no answer for item"):
        RecordedResponses({("", "ev-ja-01"): "x"}, {"": eval_items})


def test_generate_only_writes_answers_the_gate_can_score_later(
    tiny_model_dir: Path, tmp_path: Path, eval_items: list[EvalItem],
    checkpoints: tuple[Path, Path], capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    # Real transformers generation with the tiny bf16 model (the main venv can load it), one
    # model per process as the vLLM path needs; the gate then scores the recorded answers.
    code = main([
        "--generate-only", "baseline", "--baseline-model", str(tiny_model_dir),
        "--max-new-tokens", "4", "--batch-size", "25", "--report-dir", str(tmp_path),
    ])  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in (tmp_path / "responses_baseline.jsonl").read_text(
        encoding="utf-8").splitlines()]  # fmt: skip
    assert [row["id"] for row in rows] == [item.item_id for item in eval_items]
    assert all(isinstance(row["response"], str) for row in rows)
    assert "[evaluate] baseline: 50/50 prompts" in capsys.readouterr().err
    baseline, quantized = checkpoints
    code = main([
        "--baseline-model", str(baseline), "--quantized-model", str(quantized),
        "--baseline-responses", str(tmp_path / "responses_baseline.jsonl"),
        "--quantized-responses", str(tmp_path / "responses_baseline.jsonl"),
        "--report-dir", str(tmp_path / "gate"),
    ])  # fmt: skip
    assert code == 1  # a random model scores 0
    assert main(["--generate-only", "quantized", "--report-dir", str(tmp_path)]) == 2
    assert "--quantized-model: required" in capsys.readouterr().err
