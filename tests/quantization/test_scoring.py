"""Scoring and hallucination detection, on the requirements' own examples
(docs/design-decisions.md#answer-scoring) and the shipped catalogue."""

from __future__ import annotations

import json

import pytest

from quantization.calibration import DatasetError
from quantization.scoring import (
    EvalItem,
    TitleCatalog,
    extract_title_mentions,
    find_hallucinated_titles,
    mentions_name,
    normalize_name,
    parse_eval_set_lines,
    parse_title_catalog,
    score_response,
)

SIMILAR_TO_DEMON_SLAYER = EvalItem(
    item_id="seed-ja",
    language="ja",
    prompt="鬼滅の刃に似たマンガを5つ教えてください",
    required_titles=(("進撃の巨人",), ("呪術廻戦",), ("ワンピース",), ("僕のヒーローアカデミア",)),
    required_terms=(),
)
# The three answers the requirements quote (docs/design-decisions.md#answer-scoring).
BF16_ANSWER = (
    "鬼滅の刃(Demon Slayer)に似たマンガとして、進撃の巨人(Attack on Titan)、"
    "呪術廻戦(Jujutsu Kaisen)、ワンピース(One Piece)をお勧めします。"
)
INT8_ANSWER = (
    "鬼滅の刃に似たマンガとして、東京喰種(Tokyo Ghoul)、嘘喰いをお勧めします。"
    "また、聖おにいさん(Saint Young Men)も良いかもしれません。"
)
INT4_ANSWER = "お勧めのマンガは『九鬼スピリット』、『魔術バック』です。これらのタイトルは..."


def test_seed_examples_score_in_the_seeds_order(catalog: TitleCatalog) -> None:
    bf16 = score_response(BF16_ANSWER, SIMILAR_TO_DEMON_SLAYER, catalog)
    int8 = score_response(INT8_ANSWER, SIMILAR_TO_DEMON_SLAYER, catalog)
    int4 = score_response(INT4_ANSWER, SIMILAR_TO_DEMON_SLAYER, catalog)
    assert bf16.score == pytest.approx(5.0 * 3 / 4)  # 3 of 4 required titles, nothing invented
    assert bf16.missing == ("僕のヒーローアカデミア",)
    assert (bf16.hallucinated_titles, int8.hallucinated_titles) == ((), ())  # all real titles
    assert int8.score == 0.0  # none of the required titles
    assert int4.hallucinated_titles == ("九鬼スピリット", "魔術バック")
    assert int4.score == 0.0


def test_hallucination_penalty_is_a_quarter_per_title(catalog: TitleCatalog) -> None:
    item = EvalItem("i", "en", "p", required_titles=(("Attack on Titan",),), required_terms=())
    clean = 'Try "Attack on Titan".'
    assert score_response(clean, item, catalog).score == 5.0
    one = 'Try "Attack on Titan" and "Titan Hunters Academy".'
    assert score_response(one, item, catalog).score == pytest.approx(5.0 * 0.75)
    five = clean + "".join(f' "Fake Title {n}"' for n in "ABCDE")
    assert score_response(five, item, catalog).score == 0.0  # clamped at 0


def test_required_titles_match_any_catalogue_name_and_terms_any_alternative(
    catalog: TitleCatalog,
) -> None:
    item = EvalItem(
        "i", "ja", "p",
        required_titles=(("鬼滅の刃",), ("チェンソーマン", "約束のネバーランド")),
        required_terms=(("23巻", "全23"),),
    )  # fmt: skip
    answer = '"Demon Slayer: Kimetsu no Yaiba" は全23冊…いえ、『約束のネバーランド』もどうぞ。'
    scored = score_response(answer, item, catalog)
    assert scored.found == ("鬼滅の刃", "約束のネバーランド", "全23")
    assert scored.score == 5.0
    scored = score_response("『ONE PIECE』をどうぞ。", item, catalog)
    assert scored.missing == ("鬼滅の刃", "チェンソーマン | 約束のネバーランド", "23巻 | 全23")


def test_names_match_across_width_case_and_punctuation() -> None:
    assert normalize_name("『SPY×FAMILY』") == normalize_name("spy family") == "spyfamily"
    assert normalize_name("ＯＮＥ　ＰＩＥＣＥ") == "onepiece"
    assert normalize_name("ハイキュー!!") == "ハイキュー"  # ー is a letter, ! is not
    assert mentions_name("I loved Spy × Family!", "SPY FAMILY")
    assert not mentions_name("a banana split", "NANA")  # Latin names are whole words
    assert mentions_name("I read NANA last year", "Nana")
    assert mentions_name("ワンピース第1巻", "ワンピース")


def test_mentions_are_found_in_every_marked_form(catalog: TitleCatalog) -> None:
    answer = (
        "『進撃の巨人』(Attack on Titan)と《寄生獣》がおすすめです。\n"
        'In English, try "Monster" or “Pluto”.\n'
        "1. **Dorohedoro** – grotesque and funny\n"
        "- *Made in Abyss*\n"
        "鬼滅の刃(Demon Slayer)も人気です。"
    )
    mentions = extract_title_mentions(answer, catalog)
    assert [(m.text, m.kind) for m in mentions] == [
        ("進撃の巨人", "brackets"),
        ("Attack on Titan", "gloss"),
        ("寄生獣", "brackets"),
        ("Monster", "quotes"),
        ("Pluto", "quotes"),
        ("Dorohedoro", "list-emphasis"),
        ("Made in Abyss", "list-emphasis"),
        ("Demon Slayer", "gloss"),
    ]
    assert find_hallucinated_titles(answer, catalog) == []


def test_what_is_not_a_title_is_not_flagged(catalog: TitleCatalog) -> None:
    answer = (
        '完全版 means "complete edition". She said "I\'m not sure." '
        'Click "Notify me." It ran in "Weekly Shōnen Jump" (Shueisha).\n'
        "- **Note:** prices vary\n"
        '『ONE PIECE』第100巻、『鋼の錬金術師 完全版』、"Attack on Titan Vol. 3"、'
        '"Naruto 3-in-1 Edition".'
    )
    assert find_hallucinated_titles(answer, catalog) == []


def test_invented_titles_are_flagged_in_every_marked_form(catalog: TitleCatalog) -> None:
    answer = (
        "『魔術バック』と『進撃の巨人』(Titan Wars Chronicle)をどうぞ。\n"
        'Also "Shadow Blade Academy".\n'
        "1. **Crimson Samurai Saga** — a classic\n"
    )
    assert find_hallucinated_titles(answer, catalog) == [
        "魔術バック",
        "Titan Wars Chronicle",
        "Shadow Blade Academy",
        "Crimson Samurai Saga",
    ]
    assert find_hallucinated_titles(answer, catalog, allowed=["Shadow Blade Academy"]) == [
        "魔術バック",
        "Titan Wars Chronicle",
        "Crimson Samurai Saga",
    ]


def test_catalogue_and_eval_set_validation(catalog: TitleCatalog) -> None:
    with pytest.raises(DatasetError, match=r"titles\[0\]: field 'en' must be a title"):
        parse_title_catalog({"titles": [{"ja": "鬼滅の刃", "en": "  "}]}, source="t.json")
    with pytest.raises(DatasetError, match="expected an object with a 'titles' list"):
        parse_title_catalog([], source="t.json")

    def line(**fields: object) -> str:
        return json.dumps({"id": "e1", "language": "en", "prompt": "p", **fields})

    with pytest.raises(DatasetError, match=r"not in the known-title catalogue"):
        parse_eval_set_lines([line(required_titles=["Kuki Spirit"])], catalog, source="e")
    with pytest.raises(DatasetError, match="needs at least one required title or term"):
        parse_eval_set_lines([line()], catalog, source="e")
    with pytest.raises(DatasetError, match=r"e:1: field 'required_terms' has \[\]"):
        parse_eval_set_lines([line(required_terms=[[]])], catalog, source="e")
    with pytest.raises(DatasetError, match=r"e:1: field 'language' is 'de'"):
        parse_eval_set_lines([line(language="de", required_terms=["x"])], catalog, source="e")


def test_shipped_eval_set(eval_items: list[EvalItem]) -> None:
    by_language = {lang: [i for i in eval_items if i.language == lang] for lang in ("ja", "en")}
    assert len(by_language["ja"]) == len(by_language["en"]) == 25
    assert all(item.requirement_count >= 1 for item in eval_items)
