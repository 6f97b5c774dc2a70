"""The strings the LLM stack writes and the gateway reads: one format, round trips exactly.

The property tests generate what the stack's settings accept (adapter names and directories,
intents, locales) and check that the gateway's parse of the stack's text is the structure the
stack started from — through the real producer (``container_environment``) and the real
consumer (``gateway.settings.load_settings``) as well as the contract's own pair of functions.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.settings import load_settings
from intents import INTENT_LABELS
from serving_contract import (
    ADAPTER_NAME_PATTERN,
    BASE_ROUTE,
    DIRECTORY_PATTERN,
    LOCALE_PATTERN,
    FormatError,
    format_adapters,
    format_locale_routes,
    format_routing,
    normalize_locale,
    parse_adapters,
    parse_locale_routes,
    parse_routing,
)
from stacks.llm_endpoint import container_environment
from stacks.settings import load_settings as load_stack_settings

names = st.from_regex(ADAPTER_NAME_PATTERN, fullmatch=True).filter(
    lambda name: name not in (BASE_ROUTE, "auto"))
directories = st.from_regex(DIRECTORY_PATTERN, fullmatch=True).filter(
    lambda name: name not in (".", ".."))
locales = st.sampled_from(["ja-JP", "en-US", "ko-KR", "zh-Hant-TW", "fr", "pt-BR"])


@st.composite
def adapter_sets(draw: st.DrawFn) -> list[tuple[str, str]]:
    chosen = draw(st.lists(names, min_size=0, max_size=6, unique=True))
    return [(name, draw(directories)) for name in chosen]


@settings(max_examples=200)
@given(adapters=adapter_sets())
def test_adapters_round_trip_in_order(adapters: list[tuple[str, str]]) -> None:
    assert parse_adapters(format_adapters(adapters)) == adapters


@settings(max_examples=200)
@given(table=st.dictionaries(st.sampled_from(INTENT_LABELS), names | st.just(BASE_ROUTE)))
def test_routing_round_trips(table: dict[str, str]) -> None:
    assert dict(parse_routing(format_routing(table))) == table


@settings(max_examples=200)
@given(routes=st.dictionaries(locales, st.dictionaries(names, names, min_size=1, max_size=3),
                              max_size=4))
def test_locale_routes_round_trip(routes: dict[str, dict[str, str]]) -> None:
    expected = {normalize_locale(locale): table for locale, table in routes.items()}
    assert parse_locale_routes(format_locale_routes(routes)) == expected


@pytest.mark.parametrize("environment", ["dev", "prod"])
def test_what_the_stack_writes_is_what_the_gateway_reads(environment: str) -> None:
    """The real producer and consumer, on each environment's configuration."""
    llm = load_stack_settings(environment).llm
    env = container_environment(llm, llm.capacity_plan(), endpoint_name="e", variant_name="v")
    gateway = load_settings(env).gateway
    assert [(a.name, a.directory) for a in gateway.adapters] == \
        [(a.name, a.folder) for a in llm.adapters]
    assert dict(gateway.routing_table) == llm.routing
    assert dict(gateway.locale_routes) == {
        (normalize_locale(locale), source): target
        for locale, table in llm.locale_routes.items() for source, target in table.items()}


@pytest.mark.parametrize(("parse", "text", "item"), [
    (parse_adapters, "manga=manga_domain,support", "support"),
    (parse_routing, "faq=", "faq="),
    (parse_locale_routes, "manga=manga-ja", "manga=manga-ja"),
    (parse_locale_routes, "ja_JP:manga=manga-ja", "manga=manga-ja"),
])
def test_a_malformed_string_names_its_bad_item(parse: object, text: str, item: str) -> None:
    with pytest.raises(FormatError) as info:
        parse(text)  # type: ignore[operator]
    assert info.value.item == item
    assert repr(item) in str(info.value)


def test_the_patterns_are_the_ones_both_sides_validate_with() -> None:
    """The stack's pydantic types and the gateway's parser take their patterns from here."""
    from stacks import settings as stack_settings

    for annotated, pattern in ((stack_settings.AdapterName, ADAPTER_NAME_PATTERN),
                               (stack_settings.FolderName, DIRECTORY_PATTERN),
                               (stack_settings.LocaleTag, LOCALE_PATTERN)):
        (constraint,) = annotated.__metadata__
        assert constraint.pattern == pattern.pattern
