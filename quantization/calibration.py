"""Calibration set builder: manga Q&A records → texts in the production chat template.

AWQ picks which weight channels to protect from the activations it sees during calibration, so
the calibration texts must look exactly like production traffic: the gateway's system prompt,
the customer's question and a good answer, rendered by the served model's own chat template
(Llama-3-Instruct's header tokens, BOS once), tokenized by the served model's own tokenizer.
Generic web text or a hand-written ``<|system|>`` template calibrates for a different input
distribution — the mistake that cost 0.7 points on Japanese
(docs/design-decisions.md#calibration-set).

The tokenizer is injected (:class:`ChatTokenizer`): :mod:`quantization.chat_tokenizer` adapts a
Hugging Face tokenizer loaded from the model directory; tests may pass any implementation.

Pure module: standard library only (reading a JSONL file is the only I/O).
"""

from __future__ import annotations

import json
import random
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, TypedDict

from prompts import MANGAASSIST_SYSTEM_PROMPT

Language = Literal["ja", "en"]
SUPPORTED_LANGUAGES: tuple[Language, ...] = ("ja", "en")

LONG_ANSWER_MIN_CHARS: dict[Language, int] = {"ja": 150, "en": 350}
"""An answer at least this long counts as a long recommendation (Japanese packs ≈2.5× the
meaning per character, hence the lower bar)."""

MIN_MAX_SEQ_LEN = 32
"""Below this a calibration sample holds little more than the chat headers."""


class DatasetError(ValueError):
    """A Q&A or evaluation file is malformed; the message names the file, line and field."""


class ChatMessage(TypedDict):
    """One chat turn as chat templates and vLLM take it."""

    role: str
    content: str


class ChatTokenizer(Protocol):
    """What the builder needs from the served model's tokenizer."""

    def render_chat(self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool) -> str:
        """Render ``messages`` with the model's own chat template (BOS included)."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of already-rendered text, adding no special tokens of its own."""
        ...


@dataclass(frozen=True)
class MangaQARecord:
    """One manga Q&A pair: what a customer asked and a good answer, in one language."""

    record_id: str
    language: Language
    question: str
    answer: str


def _require_text(obj: dict[str, object], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"{where}: field {key!r} must be a non-empty string, got {value!r}")
    return value


def require_language(value: object, where: str) -> Language:
    """Return ``value`` as a :data:`Language` or raise :class:`DatasetError` naming it."""
    if value == "ja":
        return "ja"
    if value == "en":
        return "en"
    raise DatasetError(
        f"{where}: field 'language' is {value!r}; accepted: {', '.join(SUPPORTED_LANGUAGES)}"
    )


def parse_jsonl_objects(
    lines: Iterable[str], *, source: str
) -> list[tuple[str, dict[str, object]]]:
    """Parse JSONL into ``(where, object)`` pairs, ``where`` being ``source:line``.

    Blank lines are skipped; anything that is not a JSON object is a :class:`DatasetError`.
    """
    parsed: list[tuple[str, dict[str, object]]] = []
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{line_number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as error:
            raise DatasetError(f"{where}: not valid JSON ({error.msg})") from error
        if not isinstance(obj, dict):
            raise DatasetError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        parsed.append((where, obj))
    return parsed


def parse_manga_qa_lines(lines: Iterable[str], *, source: str = "<input>") -> list[MangaQARecord]:
    """Parse manga Q&A JSONL: objects with ``question``, ``answer``, ``language`` (and ``id``).

    Records without an ``id`` get ``source:line``. Duplicate ids are refused.
    """
    records: list[MangaQARecord] = []
    seen_ids: dict[str, str] = {}
    for where, obj in parse_jsonl_objects(lines, source=source):
        raw_id = obj.get("id", where)
        if not isinstance(raw_id, str) or not raw_id:
            raise DatasetError(f"{where}: field 'id' must be a non-empty string, got {raw_id!r}")
        if raw_id in seen_ids:
            raise DatasetError(f"{where}: id {raw_id!r} already used at {seen_ids[raw_id]}")
        seen_ids[raw_id] = where
        records.append(
            MangaQARecord(
                record_id=raw_id,
                language=require_language(obj.get("language"), where),
                question=_require_text(obj, "question", where),
                answer=_require_text(obj, "answer", where),
            )
        )
    if not records:
        raise DatasetError(f"{source}: no records")
    return records


def load_manga_qa_jsonl(path: Path) -> list[MangaQARecord]:
    """Read and validate a manga Q&A JSONL file."""
    with path.open(encoding="utf-8") as handle:
        return parse_manga_qa_lines(handle, source=str(path))


# --- script classification (for coverage statistics) ----------------------------------------


def contains_japanese(text: str) -> bool:
    """True if ``text`` has hiragana, katakana (full or half width) or CJK ideographs."""
    return any(
        "\u3040" <= ch <= "\u30ff"
        or "\u3400" <= ch <= "\u4dbf"
        or "\u4e00" <= ch <= "\u9fff"
        or "\uff66" <= ch <= "\uff9f"
        for ch in text
    )


def contains_latin(text: str) -> bool:
    """True if ``text`` has ASCII or full-width Latin letters."""
    return any(("a" <= ch.lower() <= "z") or ("\uff21" <= ch <= "\uff5a") for ch in text)


def contains_digits(text: str) -> bool:
    """True if ``text`` has a digit (ASCII, full-width or kanji numerals used for volumes)."""
    return any(ch.isdigit() or ch in "一二三四五六七八九十百" for ch in text)


def is_mixed_script(text: str) -> bool:
    """True if ``text`` mixes Japanese script and Latin letters (e.g. 『ONE PIECE』第1巻)."""
    return contains_japanese(text) and contains_latin(text)


def is_long_answer(record: MangaQARecord) -> bool:
    """True if the answer is long enough to count as a long-form recommendation."""
    return len(record.answer) >= LONG_ANSWER_MIN_CHARS[record.language]


@dataclass(frozen=True)
class DatasetCoverage:
    """What a Q&A dataset covers: the properties calibration data must have
    (docs/design-decisions.md#calibration-set)."""

    total: int
    by_language: dict[str, int]
    mixed_script: int
    with_numbers: int
    long_answers: int


def describe_coverage(records: Sequence[MangaQARecord]) -> DatasetCoverage:
    """Count languages, mixed-script pairs, pairs with numbers and long answers."""
    by_language = Counter(record.language for record in records)
    return DatasetCoverage(
        total=len(records),
        by_language={language: by_language.get(language, 0) for language in SUPPORTED_LANGUAGES},
        mixed_script=sum(is_mixed_script(r.question + r.answer) for r in records),
        with_numbers=sum(contains_digits(r.question + r.answer) for r in records),
        long_answers=sum(is_long_answer(r) for r in records),
    )


# --- the builder ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationSettings:
    """How many samples and how long each may be (tokens of the served model)."""

    num_samples: int = 512
    max_seq_len: int = 768
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_samples < 1:
            raise ValueError(f"num_samples: {self.num_samples} is not accepted; use 1 or more")
        if self.max_seq_len < MIN_MAX_SEQ_LEN:
            raise ValueError(
                f"max_seq_len: {self.max_seq_len} is not accepted; use {MIN_MAX_SEQ_LEN} or more "
                "tokens"
            )


def calibration_messages(
    record: MangaQARecord, system_prompt: str = MANGAASSIST_SYSTEM_PROMPT
) -> list[ChatMessage]:
    """The conversation a calibration sample renders: system prompt, question, answer."""
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": record.question},
        {"role": "assistant", "content": record.answer},
    ]


def select_records(
    records: Sequence[MangaQARecord], num_samples: int, seed: int
) -> list[MangaQARecord]:
    """Pick up to ``num_samples`` records, keeping the dataset's Japanese/English proportions.

    Deterministic for a given seed. Each language is shuffled on its own and the picks are
    interleaved, so a truncated run (or a small ``num_samples``) still sees both languages.
    """
    if num_samples >= len(records):
        chosen = list(records)
        random.Random(seed).shuffle(chosen)
        return chosen
    by_language: dict[str, list[MangaQARecord]] = {}
    for record in records:
        by_language.setdefault(record.language, []).append(record)
    rng = random.Random(seed)
    quotas: dict[str, int] = {}
    for language, group in sorted(by_language.items()):
        rng.shuffle(group)
        quotas[language] = max(1, round(num_samples * len(group) / len(records)))
    # Rounding may overshoot by one per language; trim the largest quota first.
    while sum(quotas.values()) > num_samples:
        largest = max(quotas, key=lambda language: quotas[language])
        quotas[largest] -= 1
    picks = {language: group[: quotas[language]] for language, group in by_language.items()}
    interleaved: list[MangaQARecord] = []
    for index in range(max(len(group) for group in picks.values())):
        for language in sorted(picks):
            if index < len(picks[language]):
                interleaved.append(picks[language][index])
    return interleaved


@dataclass(frozen=True)
class CalibrationSample:
    """One calibration input: the rendered chat and its (possibly truncated) token ids."""

    record_id: str
    language: Language
    text: str
    input_ids: tuple[int, ...]
    full_token_count: int
    mixed_script: bool
    with_numbers: bool

    @property
    def truncated(self) -> bool:
        """True if the rendered chat was longer than ``max_seq_len`` and was cut."""
        return self.full_token_count > len(self.input_ids)


@dataclass(frozen=True)
class CalibrationStats:
    """Summary of a calibration set, printed by the CLI and written to the job manifest."""

    requested_samples: int
    num_samples: int
    by_language: dict[str, int]
    truncated: int
    mixed_script: int
    with_numbers: int
    min_tokens: int
    mean_tokens: float
    max_tokens: int
    total_tokens: int
    max_seq_len: int

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class CalibrationSet:
    """The samples AWQ calibrates on, in the order they were selected."""

    samples: tuple[CalibrationSample, ...]
    settings: CalibrationSettings
    system_prompt: str = field(repr=False)

    @property
    def stats(self) -> CalibrationStats:
        """Counts and token-length figures of this set."""
        lengths = [len(sample.input_ids) for sample in self.samples]
        by_language = Counter(sample.language for sample in self.samples)
        return CalibrationStats(
            requested_samples=self.settings.num_samples,
            num_samples=len(self.samples),
            by_language={lang: by_language.get(lang, 0) for lang in SUPPORTED_LANGUAGES},
            truncated=sum(sample.truncated for sample in self.samples),
            mixed_script=sum(sample.mixed_script for sample in self.samples),
            with_numbers=sum(sample.with_numbers for sample in self.samples),
            min_tokens=min(lengths),
            mean_tokens=round(statistics.fmean(lengths), 1),
            max_tokens=max(lengths),
            total_tokens=sum(lengths),
            max_seq_len=self.settings.max_seq_len,
        )

    def token_id_lists(self) -> list[list[int]]:
        """The token ids of every sample, as the quantization backends take them."""
        return [list(sample.input_ids) for sample in self.samples]

    def to_jsonl_rows(self) -> list[dict[str, object]]:
        """One JSON-ready row per sample (for inspecting what calibration saw)."""
        return [
            {
                "id": sample.record_id,
                "language": sample.language,
                "num_tokens": len(sample.input_ids),
                "truncated": sample.truncated,
                "text": sample.text,
            }
            for sample in self.samples
        ]


def build_calibration_set(
    records: Sequence[MangaQARecord],
    tokenizer: ChatTokenizer,
    settings: CalibrationSettings,
    *,
    system_prompt: str = MANGAASSIST_SYSTEM_PROMPT,
) -> CalibrationSet:
    """Render, tokenize and truncate the selected records into a :class:`CalibrationSet`."""
    if not records:
        raise DatasetError("calibration: no Q&A records to build from")
    samples: list[CalibrationSample] = []
    for record in select_records(records, settings.num_samples, settings.seed):
        text = tokenizer.render_chat(
            calibration_messages(record, system_prompt), add_generation_prompt=False
        )
        token_ids = tokenizer.encode(text)
        if not token_ids:
            raise DatasetError(f"{record.record_id}: rendered chat tokenized to no tokens")
        samples.append(
            CalibrationSample(
                record_id=record.record_id,
                language=record.language,
                text=text,
                input_ids=tuple(token_ids[: settings.max_seq_len]),
                full_token_count=len(token_ids),
                # Judged on the Q&A pair: the bilingual system prompt is in every sample.
                mixed_script=is_mixed_script(record.question + record.answer),
                with_numbers=contains_digits(record.question + record.answer),
            )
        )
    return CalibrationSet(samples=tuple(samples), settings=settings, system_prompt=system_prompt)
