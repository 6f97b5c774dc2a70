"""Calibration set builder: data validation, selection, and rendering with the real template."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from prompts import MANGAASSIST_SYSTEM_PROMPT
from quantization.calibration import (
    CalibrationSettings,
    DatasetError,
    MangaQARecord,
    build_calibration_set,
    calibration_messages,
    describe_coverage,
    parse_manga_qa_lines,
    select_records,
)
from quantization.chat_tokenizer import HuggingFaceChatTokenizer
from quantization.scoring import TitleCatalog, find_hallucinated_titles


def _line(**fields: object) -> str:
    return json.dumps(fields, ensure_ascii=False)


def test_parses_records_and_names_the_line_of_bad_ones() -> None:
    good = _line(id="a", language="ja", question="鬼滅の刃は何巻?", answer="全23巻です。")
    records = parse_manga_qa_lines([good, "", _line(language="en", question="q", answer="a")],
                                   source="qa.jsonl")  # fmt: skip
    assert records[0] == MangaQARecord("a", "ja", "鬼滅の刃は何巻?", "全23巻です。")
    assert records[1].record_id == "qa.jsonl:3"  # id defaults to the line

    with pytest.raises(
        DatasetError, match=r"qa.jsonl:2: field 'language' is 'fr'; accepted: ja, en"
    ):
        parse_manga_qa_lines([good, _line(language="fr", question="q", answer="a")],
                             source="qa.jsonl")  # fmt: skip
    with pytest.raises(DatasetError, match=r"qa.jsonl:1: field 'answer' must be a non-empty"):
        parse_manga_qa_lines([_line(language="en", question="q", answer=" ")], source="qa.jsonl")
    with pytest.raises(DatasetError, match=r"qa.jsonl:1: not valid JSON"):
        parse_manga_qa_lines(["{not json"], source="qa.jsonl")
    with pytest.raises(DatasetError, match=r"id 'a' already used at qa.jsonl:1"):
        parse_manga_qa_lines([good, good], source="qa.jsonl")
    with pytest.raises(DatasetError, match="no records"):
        parse_manga_qa_lines(["", "  "], source="qa.jsonl")


def test_settings_reject_nonsense_with_the_field_name() -> None:
    with pytest.raises(ValueError, match="num_samples: 0 is not accepted"):
        CalibrationSettings(num_samples=0)
    with pytest.raises(ValueError, match="max_seq_len: 8 is not accepted; use 32 or more"):
        CalibrationSettings(max_seq_len=8)


def test_shipped_dataset_covers_what_seed_001_asks_for(qa_records: list[MangaQARecord]) -> None:
    coverage = describe_coverage(qa_records)
    assert coverage.total >= 200
    assert coverage.by_language["ja"] >= 100
    assert coverage.by_language["en"] >= 80
    assert coverage.mixed_script >= 40  # 『ONE PIECE』第1巻, "Demon Slayer" in a Japanese answer …
    assert coverage.with_numbers >= 150  # volume and chapter numbers
    assert coverage.long_answers >= 10  # long-form recommendations


def test_shipped_answers_follow_the_title_convention_and_invent_nothing(
    qa_records: list[MangaQARecord], catalog: TitleCatalog
) -> None:
    # Calibration answers are what the model should say: every marked title must be real.
    invented = {r.record_id: find_hallucinated_titles(r.answer, catalog) for r in qa_records}
    assert {rid: titles for rid, titles in invented.items() if titles} == {}
    marked = sum("『" in r.answer for r in qa_records if r.language == "ja")
    assert marked >= 0.9 * sum(r.language == "ja" for r in qa_records)


def test_selection_keeps_language_proportions_and_is_deterministic(
    qa_records: list[MangaQARecord],
) -> None:
    picked = select_records(qa_records, 50, seed=7)
    assert len(picked) == 50
    assert select_records(qa_records, 50, seed=7) == picked
    assert select_records(qa_records, 50, seed=8) != picked
    share_ja = sum(r.language == "ja" for r in qa_records) / len(qa_records)
    assert Counter(r.language for r in picked)["ja"] == round(50 * share_ja)
    assert {r.language for r in picked[:2]} == {"ja", "en"}  # interleaved
    assert len({r.record_id for r in picked}) == 50
    everything = select_records(qa_records, 10_000, seed=0)
    assert sorted(r.record_id for r in everything) == sorted(r.record_id for r in qa_records)


def test_messages_carry_the_production_system_prompt() -> None:
    record = MangaQARecord("x", "en", "How many volumes?", "23.")
    assert calibration_messages(record) == [
        {"role": "system", "content": MANGAASSIST_SYSTEM_PROMPT},
        {"role": "user", "content": "How many volumes?"},
        {"role": "assistant", "content": "23."},
    ]


def test_builds_with_the_models_own_llama3_template(
    tiny_tokenizer_dir: Path, qa_records: list[MangaQARecord]
) -> None:
    tokenizer = HuggingFaceChatTokenizer.from_model_dir(tiny_tokenizer_dir)
    settings = CalibrationSettings(num_samples=20, max_seq_len=4096, seed=1)
    calibration = build_calibration_set(qa_records, tokenizer, settings)
    assert len(calibration.samples) == 20
    sample = calibration.samples[0]
    record = next(r for r in qa_records if r.record_id == sample.record_id)
    assert sample.text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        f"{MANGAASSIST_SYSTEM_PROMPT.strip()}<|eot_id|>"
        f"<|start_header_id|>user<|end_header_id|>\n\n{record.question.strip()}<|eot_id|>"
        f"<|start_header_id|>assistant<|end_header_id|>\n\n{record.answer.strip()}<|eot_id|>"
    )
    hf = tokenizer.hf_tokenizer
    # BOS exactly once: the template writes it, encoding must not add a second one.
    assert sample.input_ids[0] == hf.bos_token_id
    assert sample.input_ids.count(hf.bos_token_id) == 1
    assert hf.decode(list(sample.input_ids)) == sample.text  # Japanese round-trips
    assert list(sample.input_ids).count(hf.convert_tokens_to_ids("<|eot_id|>")) == 3
    stats = calibration.stats
    assert stats.num_samples == 20
    assert stats.truncated == 0
    assert stats.by_language["ja"] + stats.by_language["en"] == 20
    assert stats.min_tokens <= stats.mean_tokens <= stats.max_tokens
    assert calibration.token_id_lists()[0] == list(sample.input_ids)


def test_truncates_to_max_seq_len_and_reports_it(
    tiny_tokenizer_dir: Path, qa_records: list[MangaQARecord]
) -> None:
    tokenizer = HuggingFaceChatTokenizer.from_model_dir(tiny_tokenizer_dir)
    calibration = build_calibration_set(
        qa_records, tokenizer, CalibrationSettings(num_samples=12, max_seq_len=64)
    )
    assert all(len(s.input_ids) == 64 for s in calibration.samples)
    assert all(s.truncated and s.full_token_count > 64 for s in calibration.samples)
    assert calibration.stats.truncated == 12
    row = calibration.to_jsonl_rows()[0]
    assert row["num_tokens"] == 64
    assert row["truncated"] is True


def test_refuses_a_tokenizer_without_chat_template(tiny_tokenizer_dir: Path) -> None:
    tokenizer = HuggingFaceChatTokenizer.from_model_dir(tiny_tokenizer_dir).hf_tokenizer
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        HuggingFaceChatTokenizer(tokenizer, source="m")
    with pytest.raises(ValueError, match=r"model_dir: .* is not a directory"):
        HuggingFaceChatTokenizer.from_model_dir(tiny_tokenizer_dir / "missing")
