"""The gate per adapter: each served adapter's own evaluation set, its own section, its verdict.

The pure parts run here with injected and recorded answers; the real generators, the AWQ
checkpoint and trained adapters run in tests/quantization/test_adapter_gate_cpu.py.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest
import yaml

from quantization.adapters import (
    ADAPTER_EVAL_SETS,
    AdapterError,
    lora_modules,
    lora_scale,
    parse_named,
    served_tasks,
)
from quantization.calibration import ChatMessage
from quantization.evaluate import (
    AdapterUnderTest,
    PerConversationGenerator,
    main,
    run_candidate_gate,
)
from quantization.gate import CandidateReport, candidate_to_dict, render_candidate_markdown
from quantization.scoring import EvalItem, TitleCatalog, load_eval_set
from tests.quantization.test_gate import SMALLER, checkpoints, good_answer  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO_ROOT / "config").glob("*.yaml"))


@pytest.fixture(scope="module")
def adapter_sets(catalog: TitleCatalog) -> dict[str, list[EvalItem]]:
    return {name: load_eval_set(path, catalog) for name, path in ADAPTER_EVAL_SETS.items()}


def _llm(config: Path) -> dict[str, object]:
    llm = yaml.safe_load(config.read_text(encoding="utf-8")).get("llm", {})
    assert isinstance(llm, dict)
    return llm


@pytest.mark.parametrize("config", [c for c in CONFIGS if _llm(c).get("adapters")],
                         ids=lambda c: c.name)
def test_each_served_adapter_has_a_set_of_exactly_what_the_routing_sends_it(
    config: Path, adapter_sets: dict[str, list[EvalItem]]
) -> None:
    llm = _llm(config)
    routing = llm["routing"]
    locale_routes = llm.get("locale_routes", {})
    assert isinstance(routing, dict) and isinstance(locale_routes, dict)
    tasks = served_tasks(routing, locale_routes)
    adapters = llm["adapters"]
    assert isinstance(adapters, list)
    for adapter in adapters:
        name = adapter["name"]
        assert name in ADAPTER_EVAL_SETS, f"{config.name}: adapter {name} has no evaluation set"
        covered = {(item.intent, item.language) for item in adapter_sets[name]}
        assert covered == tasks[name], name
    # prod: manga answers product questions in English, manga-ja the same in Japanese.
    if config.name == "prod.yaml":
        assert {lang for _, lang in tasks["manga-ja"]} == {"ja"}
        assert {intent for intent, _ in tasks["support"]} == {
            "order_tracking", "return_request", "escalation"}


def _without_titles(prompt: str, catalog: TitleCatalog) -> str:
    text = unicodedata.normalize("NFKC", prompt)
    for title in catalog.titles:
        for name in sorted(title.names, key=len, reverse=True):
            text = re.sub(re.escape(unicodedata.normalize("NFKC", name)), "", text,
                          flags=re.IGNORECASE)
    return re.sub(r"[\W_]+", "", text)


def test_the_sets_are_reviewable(adapter_sets: dict[str, list[EvalItem]],
                                 catalog: TitleCatalog) -> None:
    """Each item names its intent and required items a reader can check (load_eval_set refuses
    a title outside the catalogue); no prompt is only a title; no id or prompt twice."""
    ids: list[str] = []
    for name, items in adapter_sets.items():
        assert len(items) >= 20, name
        for item in items:
            ids.append(item.item_id)
            assert item.intent, item.item_id
            assert item.requirement_count >= 1
            # Japanese packs a question into fewer characters than English.
            minimum = 6 if item.language == "ja" else 12
            assert len(_without_titles(item.prompt, catalog)) >= minimum, item.item_id
    assert len(ids) == len(set(ids))
    prompts = [item.prompt for items in adapter_sets.values() for item in items]
    assert len(prompts) == len(set(prompts))
    # support: both languages, 10 each; manga-ja Japanese only, manga English only.
    languages = {name: sorted({i.language for i in items}) for name, items in adapter_sets.items()}
    assert languages == {"manga": ["en"], "support": ["en", "ja"], "manga-ja": ["ja"]}


def test_named_options_and_lora_files_are_checked() -> None:
    assert parse_named(["manga=a/b", "support = c"], "--adapter") == {"manga": "a/b",
                                                                       "support": "c"}
    with pytest.raises(AdapterError, match=r"--adapter: 'manga' is not accepted; use NAME=VALUE"):
        parse_named(["manga"], "--adapter")
    with pytest.raises(AdapterError, match="given twice"):
        parse_named(["a=1", "a=2"], "--adapter")
    assert lora_scale({"r": 8, "lora_alpha": 16}, where="x") == 2.0
    assert lora_scale({"r": 16, "lora_alpha": 16, "use_rslora": True}, where="x") == 4.0
    with pytest.raises(AdapterError, match=r"x: r: 0 is not accepted; a LoRA rank of 1 or more"):
        lora_scale({"r": 0}, where="x")
    keys = ["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    assert lora_modules(keys, where="w") == {"model.layers.0.self_attn.q_proj": tuple(keys)}
    with pytest.raises(AdapterError, match=r"has only \.lora_A\.weight; LoRA needs lora_A and"):
        lora_modules(keys[:1], where="w")
    with pytest.raises(AdapterError, match=r"tensor 'lm_head\.weight' is not accepted"):
        lora_modules(["lm_head.weight"], where="w")


def _adapter_dir(root: Path, folder: str, rank: int = 8) -> Path:
    directory = root / folder
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": rank}))
    (directory / "adapter_model.safetensors").write_bytes(folder.encode())
    return directory


def _under_test(tmp_path: Path, name: str, folder: str, catalog: TitleCatalog
                ) -> AdapterUnderTest:
    return AdapterUnderTest.load(name, _adapter_dir(tmp_path, folder),
                                 ADAPTER_EVAL_SETS[name], catalog)


def adapter_generator(base: Callable[[EvalItem], str],
                      by_adapter: Mapping[str, Callable[[EvalItem], str]],
                      items: Sequence[EvalItem]) -> PerConversationGenerator:
    prompts: dict[str, EvalItem] = {item.prompt: item for item in items}

    def answer(conversation: Sequence[ChatMessage]) -> str:
        return base(prompts[conversation[-1]["content"]])

    def through(conversation: Sequence[ChatMessage], adapter: str) -> str:
        return by_adapter[adapter](prompts[conversation[-1]["content"]])

    return PerConversationGenerator(answer, through)


def _gate(tmp_path: Path, eval_items: list[EvalItem], catalog: TitleCatalog,
          quantized: dict[str, Callable[[EvalItem], str]]) -> CandidateReport:
    adapters = [_under_test(tmp_path, "manga", "manga_domain", catalog),
                _under_test(tmp_path, "support", "general_support", catalog),
                _under_test(tmp_path, "manga-ja", "jp_translation", catalog)]
    items = list(eval_items) + [i for a in adapters for i in a.items]
    good: dict[str, Callable[[EvalItem], str]] = {a.name: good_answer for a in adapters}
    return run_candidate_gate(
        eval_items, catalog, memory=SMALLER, adapters=adapters, progress=lambda _: None,
        baseline=adapter_generator(good_answer, good, items),
        quantized=adapter_generator(good_answer, {**good, **quantized}, items),
        base_eval_set="eval_set.jsonl")


def test_a_broken_adapter_fails_the_candidate_while_the_base_passes(
    tmp_path: Path, eval_items: list[EvalItem], catalog: TitleCatalog
) -> None:
    def forgets_the_order_number(item: EvalItem) -> str:
        return "申し訳ございません。" if item.language == "ja" else "Sorry about that."

    report = _gate(tmp_path, eval_items, catalog, {"support": forgets_the_order_number})
    assert report.base.passed
    assert not report.passed
    sections = {gate.name: gate for gate in report.adapters}
    assert list(sections) == ["manga", "support", "manga-ja"]
    assert sections["manga"].report.passed and sections["manga-ja"].report.passed
    assert not sections["support"].report.passed
    failed = [name for name, _ in report.failures]
    assert failed == ["support:score_overall", "support:score_ja", "support:score_en",
                      "support:regression_overall", "support:regression_ja",
                      "support:regression_en"]
    # Each section is scored in its set's languages; only the base has a memory check.
    assert sections["manga-ja"].report.quantized.dimensions == ("overall", "ja")
    assert sections["manga"].report.quantized.dimensions == ("overall", "en")
    assert "memory_reduction" not in {c.name for g in report.adapters for c in g.report.checks}
    data = candidate_to_dict(report)
    assert data["passed"] is False and data["base_passed"] is True
    adapters = data["adapters"]
    assert isinstance(adapters, dict)
    assert adapters["support"]["directory"] == "general_support"
    assert adapters["support"]["eval_set"] == "eval_support.jsonl"
    assert len(adapters["manga-ja"]["quantized"]["items"]) == 20
    markdown = render_candidate_markdown(report)
    assert markdown.startswith("# AWQ quality gate: FAILED\n\nFailed because:\n"
                               "- **support:score_overall**: measured 0, needs >= 4")
    for heading in ("## Base model (fp16 vs AWQ, no adapter)", "## Adapter manga (",
                    "## Adapter support (", "## Adapter manga-ja ("):
        assert heading in markdown


def test_an_invented_title_in_either_script_fails_manga_ja(
    tmp_path: Path, eval_items: list[EvalItem], catalog: TitleCatalog
) -> None:
    def invents(item: EvalItem) -> str:
        extra = "『DRAGON SAGA ZERO』" if item.item_id.endswith("01") else "『竜の王国』"
        return good_answer(item) + f"ほかに{extra}もおすすめです。"

    report = _gate(tmp_path, eval_items, catalog, {"manga-ja": invents})
    section = next(gate for gate in report.adapters if gate.name == "manga-ja")
    check = next(c for c in section.report.checks if c.name == "hallucinated_titles")
    assert not check.passed and check.measured == 20
    assert "ad-manga-ja-01: DRAGON SAGA ZERO" in check.detail
    assert "ad-manga-ja-02: 竜の王国" in check.detail
    assert report.base.passed and not report.passed


def test_every_section_says_what_its_set_resolves(
    tmp_path: Path, eval_items: list[EvalItem], catalog: TitleCatalog
) -> None:
    def drops_two(item: EvalItem) -> str:
        return "Sorry." if item.item_id in {"ad-manga-en-03", "ad-manga-en-07"} \
            else good_answer(item)

    report = _gate(tmp_path, eval_items, catalog, {"manga": drops_two})
    manga = next(gate for gate in report.adapters if gate.name == "manga")
    assert [w.split(":")[0] for w in manga.report.warnings if "cannot resolve" in w] == [
        "regression_overall", "regression_en"]
    markdown = render_candidate_markdown(report)
    assert "over 20 paired prompts): this set cannot resolve the 2 % threshold" in markdown
    # Beside each verdict: what its set can and cannot resolve, per dimension.
    assert markdown.count("What this set can resolve:") == 4
    manga_lines = candidate_to_dict(report)["adapters"]["manga"]["resolution"]  # type: ignore[index]
    assert manga_lines[0].startswith("overall: 20 prompts; one lost item (of 2) on one prompt "
                                     "is 2.50 %, this run ± ")
    assert manga_lines[0].endswith("cannot resolve the 2 % threshold, only a pass with no item "
                                   "lost or a regression well beyond it "
                                   "(docs/design-decisions.md#gate-resolution)")


def _rows(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows),
                    encoding="utf-8")
    return path


def test_cli_gates_each_adapter_from_recorded_answers(
    tmp_path: Path, eval_items: list[EvalItem], adapter_sets: dict[str, list[EvalItem]],
    checkpoints: tuple[Path, Path],  # noqa: F811 (the fixture of test_gate.py)
    capsys: pytest.CaptureFixture[str],
) -> None:
    baseline, quantized = checkpoints
    manga, support = (_adapter_dir(tmp_path / "adapters", folder)
                      for folder in ("manga_domain", "general_support"))
    base_rows = [{"id": i.item_id, "response": good_answer(i)} for i in eval_items]
    adapter_rows = [{"id": i.item_id, "response": good_answer(i), "adapter": name}
                    for name in ("manga", "support") for i in adapter_sets[name]]
    good = _rows(tmp_path / "good.jsonl", base_rows + adapter_rows)
    command = ["--baseline-model", str(baseline), "--quantized-model", str(quantized),
               "--adapter", f"manga={manga}", "--adapter", f"support={support}",
               "--baseline-responses", str(good), "--report-dir", str(tmp_path / "gate")]
    assert main([*command, "--quantized-responses", str(good)]) == 0
    report = json.loads((tmp_path / "gate" / "quality_gate.json").read_text(encoding="utf-8"))
    assert report["passed"] is True
    assert list(report["adapters"]) == ["manga", "support"]
    recorded = (tmp_path / "gate" / "responses_quantized.jsonl").read_text(encoding="utf-8")
    assert recorded.count('"adapter": "support"') == 20
    assert "## Adapter support" in capsys.readouterr().out

    broken = [dict(row, response="Sorry.") if row.get("adapter") == "manga" else row
              for row in base_rows + adapter_rows]
    assert main([*command, "--quantized-responses",
                 str(_rows(tmp_path / "broken.jsonl", broken))]) == 1
    report = json.loads((tmp_path / "gate" / "quality_gate.json").read_text(encoding="utf-8"))
    assert report["base_passed"] is True and report["passed"] is False
    assert "manga:score_overall" in report["failed_checks"]

    no_support = _rows(tmp_path / "partial.jsonl", base_rows + adapter_rows[:20])
    assert main([*command, "--quantized-responses", str(no_support)]) == 2
    assert "responses: no answer through adapter 'support' for item(s) ad-support-en-01" in \
        capsys.readouterr().err
    assert main([*command[:4], "--adapter", f"unknown={manga}", "--report-dir",
                 str(tmp_path)]) == 2
    assert ("error: --adapter: 'unknown' has no evaluation set; accepted: manga, manga-ja, "
            "support, or give --adapter-eval-set unknown=FILE.jsonl") in capsys.readouterr().err
    assert main([*command[:4], "--adapter", f"manga={tmp_path}", "--report-dir",
                 str(tmp_path)]) == 2
    assert "is not accepted; a PEFT LoRA folder with adapter_config.json" in \
        capsys.readouterr().err
