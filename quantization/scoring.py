"""Scoring one model answer, and catching invented titles.

The score is the requirements' (docs/design-decisions.md#answer-scoring).

Score of one answer, on the 0–5 scale::

    fraction = required items present / required items        (titles and terms)
    score    = clamp(fraction − 0.25 × hallucinated titles, 0, 1) × 5

A required item is a title or a term, or a list of alternatives of which any one counts
(``["全23巻", "23巻"]``). A required *title* also counts when the answer names it by any of its
catalogue names (『鬼滅の刃』 or "Demon Slayer").

A hallucinated title is a title the answer presents as one — in 『』 or 《》, in "double quotes",
as the bold/italic head of a list item, or as the English gloss in parentheses after a
Japanese title — that matches no name in the known-title catalogue (volume numbers and edition
words such as 完全版 or "Omnibus" after a known title are fine). The production system prompt
asks for exactly those marks (:mod:`prompts`), so a model that follows it
exposes every title it names to this check. Names that are not titles (magazines, publishers,
editions) are listed in the catalogue's ``other_names`` and never count.

Pure module: standard library only.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from quantization.calibration import DatasetError, Language, parse_jsonl_objects, require_language

MAX_SCORE = 5.0
HALLUCINATION_PENALTY = 0.25
"""Subtracted from the 0–1 fraction for every hallucinated title
(docs/design-decisions.md#answer-scoring)."""

MentionKind = Literal["brackets", "quotes", "list-emphasis", "gloss"]


def normalize_name(text: str) -> str:
    """Comparison key for names: NFKC, case-folded, letters/marks/digits only.

    『SPY×FAMILY』, "Spy × Family" and "spy-family" differ only in punctuation and symbols, which
    this drops; the long-vowel mark ー and 々 are letters (Lm) and stay.
    """
    folded = unicodedata.normalize("NFKC", text).casefold()
    return "".join(ch for ch in folded if unicodedata.category(ch)[0] in "LMN")


_EDITION_SUFFIX = re.compile(
    r"^(?:"
    r"第?\d+(?:巻|話|部)?|vol(?:ume)?\d+|book\d+|part\d+|上|中|下|上巻|下巻|前編|後編|"
    r"完全版|新装版|愛蔵版|文庫版|カラー版|総集編|ワイド版|新装再編版|"
    r"deluxeedition|deluxe|omnibus|omnibusedition|boxset|3in1edition|3in1|perfectedition|"
    r"fullmetaledition|collectorsedition|colored|coloredition|hardcover|paperback|kanzenban"
    r")+$"
)


@dataclass(frozen=True)
class KnownTitle:
    """One real manga title and every name it is sold under."""

    ja: str
    en: str
    aliases: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """Japanese title, English title and aliases."""
        return (self.ja, self.en, *self.aliases)


class TitleCatalog:
    """The known-title list: what counts as a real title, and which proper names are not titles."""

    def __init__(self, titles: Iterable[KnownTitle], other_names: Iterable[str] = ()) -> None:
        self.titles = tuple(titles)
        self.other_names = tuple(other_names)
        self._by_key: dict[str, KnownTitle] = {}
        for title in self.titles:
            for name in title.names:
                key = normalize_name(name)
                if key:
                    self._by_key.setdefault(key, title)
        self._keys_longest_first = sorted(self._by_key, key=len, reverse=True)
        self._other_keys = {normalize_name(name) for name in self.other_names} - {""}

    def find(self, name: str) -> KnownTitle | None:
        """The known title ``name`` refers to, allowing a volume/edition suffix; else None."""
        key = normalize_name(name)
        if not key:
            return None
        if key in self._by_key:
            return self._by_key[key]
        for known_key in self._keys_longest_first:
            if key.startswith(known_key) and _EDITION_SUFFIX.match(key[len(known_key) :]):
                return self._by_key[known_key]
        return None

    def is_other_name(self, name: str) -> bool:
        """True for a listed proper name that is not a manga title (magazine, publisher, …)."""
        return normalize_name(name) in self._other_keys

    def names_for(self, title: str) -> tuple[str, ...]:
        """Every catalogue name of ``title`` (just ``title`` itself if it is not catalogued)."""
        known = self.find(title)
        return known.names if known else (title,)

    def ja_title_keys(self) -> list[str]:
        """Normalized Japanese names, longest first (to recognise a title before a gloss)."""
        return [key for key in self._keys_longest_first if _has_japanese(key)]


def parse_title_catalog(obj: object, *, source: str = "<catalog>") -> TitleCatalog:
    """Build a catalogue from ``{"titles": [{"ja", "en", "aliases"}], "other_names": [...]}``."""
    if not isinstance(obj, Mapping) or not isinstance(obj.get("titles"), list):
        raise DatasetError(f"{source}: expected an object with a 'titles' list")
    titles: list[KnownTitle] = []
    for index, entry in enumerate(obj["titles"]):
        where = f"{source}: titles[{index}]"
        if not isinstance(entry, Mapping):
            raise DatasetError(f"{where}: expected an object, got {type(entry).__name__}")
        names: dict[str, str] = {}
        for key in ("ja", "en"):
            value = entry.get(key)
            if not isinstance(value, str) or not normalize_name(value):
                raise DatasetError(f"{where}: field {key!r} must be a title, got {value!r}")
            names[key] = value
        aliases = entry.get("aliases", [])
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            raise DatasetError(f"{where}: field 'aliases' must be a list of strings")
        titles.append(KnownTitle(ja=names["ja"], en=names["en"], aliases=tuple(aliases)))
    other_names = obj.get("other_names", [])
    if not isinstance(other_names, list) or not all(isinstance(n, str) for n in other_names):
        raise DatasetError(f"{source}: field 'other_names' must be a list of strings")
    if not titles:
        raise DatasetError(f"{source}: no titles")
    return TitleCatalog(titles, other_names)


def load_title_catalog(path: Path) -> TitleCatalog:
    """Read the known-title catalogue JSON file."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise DatasetError(f"{path}: not valid JSON ({error.msg})") from error
    return parse_title_catalog(obj, source=str(path))


# --- title mentions ---------------------------------------------------------------------------


def _has_japanese(text: str) -> bool:
    return any(
        "\u3040" <= ch <= "\u30ff" or "\u3400" <= ch <= "\u4dbf" or "\u4e00" <= ch <= "\u9fff"
        for ch in text
    )


_JA_TITLE_MARKS = re.compile(r"『([^』\n]{1,80})』|《([^》\n]{1,80})》")
_DOUBLE_QUOTES = re.compile(r"\"([^\"\n]{1,80})\"|“([^”\n]{1,80})”")
_LIST_EMPHASIS = re.compile(
    r"^[ \t]*(?:[-*・•]|\d{1,2}[.)．、])[ \t]*"  # a list marker, then an emphasised head
    r"(?:\*\*([^*\n]{1,80})\*\*|\*([^*\n]{1,80})\*|__([^_\n]{1,80})__)",
    re.MULTILINE,
)
_GLOSS = re.compile(r"[(（]([A-Za-z][^()（）\n]{0,60})[)）]")


def _title_like(text: str) -> bool:
    """Could this quoted/emphasised text be a title (rather than speech or a phrase)?"""
    stripped = text.strip()
    if not stripped or stripped[-1] in ".?,:;。、:":
        return False
    if _has_japanese(stripped):
        return True
    first_letter = next((ch for ch in stripped if ch.isalpha()), "")
    return first_letter.isupper() and len(stripped.split()) <= 10


@dataclass(frozen=True)
class TitleMention:
    """A span the answer presents as a title, and how it was marked."""

    text: str
    kind: MentionKind


def extract_title_mentions(response: str, catalog: TitleCatalog) -> list[TitleMention]:
    """Every span ``response`` presents as a manga title, in order, without duplicates."""
    found: list[tuple[int, TitleMention]] = []
    for match in _JA_TITLE_MARKS.finditer(response):
        found.append((match.start(), TitleMention(match.group(1) or match.group(2), "brackets")))
    for match in _DOUBLE_QUOTES.finditer(response):
        text = match.group(1) or match.group(2)
        if _title_like(text):
            found.append((match.start(), TitleMention(text, "quotes")))
    for match in _LIST_EMPHASIS.finditer(response):
        text = next(group for group in match.groups() if group)
        if _title_like(text):
            found.append((match.start(), TitleMention(text, "list-emphasis")))
    ja_keys = catalog.ja_title_keys()
    for match in _GLOSS.finditer(response):
        before = response[max(0, match.start() - 40) : match.start()].rstrip()
        follows_title = before.endswith(("』", "》")) or any(
            normalize_name(before).endswith(key) for key in ja_keys
        )
        if follows_title and _title_like(match.group(1)):
            found.append((match.start(), TitleMention(match.group(1), "gloss")))
    mentions: list[TitleMention] = []
    seen: set[str] = set()
    for _, mention in sorted(found, key=lambda pair: pair[0]):
        key = normalize_name(mention.text)
        if key and key not in seen:
            seen.add(key)
            mentions.append(mention)
    return mentions


def find_hallucinated_titles(
    response: str, catalog: TitleCatalog, *, allowed: Iterable[str] = ()
) -> list[str]:
    """Title mentions that match no known title, no listed other name and nothing ``allowed``."""
    allowed_keys = {normalize_name(name) for name in allowed}
    return [
        mention.text
        for mention in extract_title_mentions(response, catalog)
        if catalog.find(mention.text) is None
        and not catalog.is_other_name(mention.text)
        and normalize_name(mention.text) not in allowed_keys
    ]


def mentions_name(response: str, name: str) -> bool:
    """True if ``response`` contains ``name``, ignoring case, width, spacing and punctuation.

    Latin-only names must stand as whole words ("NANA" is not found in "banana"); names with
    Japanese are matched as substrings of the normalized text (Japanese has no word spaces).
    """
    key = normalize_name(name)
    if not key:
        return False
    if key.isascii():
        tokens = re.findall(r"[0-9a-z]+", unicodedata.normalize("NFKC", name).casefold())
        pattern = r"(?<![0-9a-z])" + r"[\W_]*".join(map(re.escape, tokens)) + r"(?![0-9a-z])"
        return re.search(pattern, unicodedata.normalize("NFKC", response).casefold()) is not None
    return key in normalize_name(response)


# --- evaluation items and scores --------------------------------------------------------------

Requirement = tuple[str, ...]
"""Alternatives of which any one satisfies the requirement (the first is its label)."""


@dataclass(frozen=True)
class EvalItem:
    """One evaluation prompt and what a good answer must contain."""

    item_id: str
    language: Language
    prompt: str
    required_titles: tuple[Requirement, ...]
    required_terms: tuple[Requirement, ...]
    intent: str | None = None
    """The intent the prompt is (an adapter's set: the routing table's intents it serves)."""

    @property
    def requirement_count(self) -> int:
        """Number of required items (the denominator of the fraction)."""
        return len(self.required_titles) + len(self.required_terms)


def _requirements(value: object, field: str, where: str) -> tuple[Requirement, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise DatasetError(f"{where}: field {field!r} must be a list, got {value!r}")
    requirements: list[Requirement] = []
    for entry in value:
        alternatives = [entry] if isinstance(entry, str) else entry
        if (
            not isinstance(alternatives, list)
            or not alternatives
            or not all(isinstance(alt, str) and normalize_name(alt) for alt in alternatives)
        ):
            raise DatasetError(
                f"{where}: field {field!r} has {entry!r}; accepted: a non-empty string or a "
                "non-empty list of alternative strings"
            )
        requirements.append(tuple(alternatives))
    return tuple(requirements)


def _intent(value: object, where: str) -> str | None:
    if value is None or (isinstance(value, str) and value.strip()):
        return value
    raise DatasetError(f"{where}: field 'intent' is {value!r}; accepted: an intent name of the "
                       "routing table (llm.routing), e.g. 'order_tracking'")


def parse_eval_set_lines(
    lines: Iterable[str], catalog: TitleCatalog, *, source: str = "<eval set>"
) -> list[EvalItem]:
    """Parse evaluation JSONL and check every required title is in the catalogue."""
    items: list[EvalItem] = []
    seen: set[str] = set()
    for where, obj in parse_jsonl_objects(lines, source=source):
        item_id = obj.get("id")
        if not isinstance(item_id, str) or not item_id:
            raise DatasetError(f"{where}: field 'id' must be a non-empty string, got {item_id!r}")
        if item_id in seen:
            raise DatasetError(f"{where}: id {item_id!r} is used twice")
        seen.add(item_id)
        prompt = obj.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise DatasetError(f"{where}: field 'prompt' must be a non-empty string")
        item = EvalItem(
            item_id=item_id,
            language=require_language(obj.get("language"), where),
            prompt=prompt,
            required_titles=_requirements(obj.get("required_titles"), "required_titles", where),
            required_terms=_requirements(obj.get("required_terms"), "required_terms", where),
            intent=_intent(obj.get("intent"), where),
        )
        if item.requirement_count == 0:
            raise DatasetError(f"{where}: needs at least one required title or term")
        for requirement in item.required_titles:
            unknown = [title for title in requirement if catalog.find(title) is None]
            if unknown:
                raise DatasetError(
                    f"{where}: required title(s) {unknown} are not in the known-title catalogue"
                )
        items.append(item)
    if not items:
        raise DatasetError(f"{source}: no evaluation items")
    return items


def load_eval_set(path: Path, catalog: TitleCatalog) -> list[EvalItem]:
    """Read and validate an evaluation-set JSONL file."""
    with path.open(encoding="utf-8") as handle:
        return parse_eval_set_lines(handle, catalog, source=str(path))


@dataclass(frozen=True)
class ResponseScore:
    """How one answer scored, and why."""

    item_id: str
    language: Language
    score: float
    found: tuple[str, ...]
    missing: tuple[str, ...]
    hallucinated_titles: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "id": self.item_id,
            "language": self.language,
            "score": self.score,
            "found": list(self.found),
            "missing": list(self.missing),
            "hallucinated_titles": list(self.hallucinated_titles),
        }


def _record(
    hit: str | None, requirement: Requirement, found: list[str], missing: list[str]
) -> None:
    if hit is None:
        missing.append(" | ".join(requirement))
    else:
        found.append(hit)


def score_response(response: str, item: EvalItem, catalog: TitleCatalog) -> ResponseScore:
    """Score one answer on the 0–5 scale (see the module docstring)."""
    found: list[str] = []
    missing: list[str] = []
    for requirement in item.required_titles:
        hit = next(
            (title for title in requirement
             if any(mentions_name(response, name) for name in catalog.names_for(title))),
            None,
        )  # fmt: skip
        _record(hit, requirement, found, missing)
    for requirement in item.required_terms:
        hit = next((term for term in requirement if mentions_name(response, term)), None)
        _record(hit, requirement, found, missing)
    allowed = [term for requirement in item.required_terms for term in requirement]
    hallucinated = find_hallucinated_titles(response, catalog, allowed=allowed)
    fraction = len(found) / item.requirement_count
    raw = fraction - HALLUCINATION_PENALTY * len(hallucinated)
    return ResponseScore(
        item_id=item.item_id,
        language=item.language,
        score=round(max(0.0, min(1.0, raw)) * MAX_SCORE, 4),
        found=tuple(found),
        missing=tuple(missing),
        hallucinated_titles=tuple(hallucinated),
    )


def score_responses(
    items: Sequence[EvalItem], responses: Sequence[str], catalog: TitleCatalog
) -> list[ResponseScore]:
    """Score answers in item order (``responses[i]`` answers ``items[i]``)."""
    if len(items) != len(responses):
        raise ValueError(f"responses: {len(responses)} answers for {len(items)} items")
    return [
        score_response(text, item, catalog) for item, text in zip(items, responses, strict=True)
    ]
