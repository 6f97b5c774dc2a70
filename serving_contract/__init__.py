"""What the LLM endpoint's stack writes into the serving container and the gateway reads back.

SageMaker hands a container its settings as a string map. For the LLM endpoint three of those
strings carry structure — the served LoRA adapters, the intent routing table and the locale
routes — and the stack (``stacks/llm_endpoint.py``, at synth) writes them while the gateway
(``containers/llm/gateway/settings.py``, at start) parses them. Both use this one module: the
names, patterns and reserved words, and a ``format_*`` / ``parse_*`` pair per string, so what one
side writes the other reads back unchanged (a round-trip property test holds them to it).

    GATEWAY_ADAPTERS       manga=manga_domain,support=general_support
    GATEWAY_ROUTING_TABLE  order_tracking=support,recommendation=manga,faq=base
    GATEWAY_LOCALE_ROUTES  ja-JP:manga=manga-ja,support=support-ja;ko-KR:manga=base

Parsing checks the shape only (:class:`FormatError` names the bad item); whether a name is a
served adapter or an intent is the reader's to check. Pure module, Python 3.10+.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

BASE_ROUTE = "base"
"""Routing value meaning "the base model, no adapter"."""
AUTO_MODEL = "auto"
"""``model`` value meaning "route by intent and locale"."""
RESERVED_NAMES = frozenset({BASE_ROUTE, AUTO_MODEL})
"""Words that can never name an adapter or the served model."""

ADAPTER_NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
"""A served adapter's name, what clients send in ``model`` (lower case: names are compared as
sent, and one spelling per adapter keeps metrics and routing tables unambiguous)."""
SERVED_MODEL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""The base model's served name (``GATEWAY_SERVED_MODEL_NAME``)."""
DIRECTORY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""An adapter's directory under ``adapters/`` (one path segment)."""
LOCALE_PATTERN = re.compile(r"^[A-Za-z]{2,3}(-[A-Za-z0-9]{2,8}){0,3}$")
"""A BCP-47-style locale tag (ja-JP, en-US, zh-Hant-TW)."""

ITEMS, PAIR, LOCALE_GROUPS, LOCALE_SEPARATOR = ",", "=", ";", ":"


class FormatError(ValueError):
    """A string that is not of its documented shape; ``item`` is the offending part."""

    def __init__(self, message: str, *, item: str) -> None:
        super().__init__(message)
        self.item = item


def normalize_locale(locale: str) -> str:
    """Canonical case of a locale tag: language lower case, region upper case (ja-JP)."""
    parts = locale.split("-")
    out = [parts[0].lower()]
    for part in parts[1:]:
        out.append(part.upper() if len(part) == 2 else part.title() if len(part) == 4 else part)
    return "-".join(out)


def _pairs(text: str) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for item in (part.strip() for part in text.split(ITEMS)):
        if not item:
            continue
        key, sep, value = (part.strip() for part in item.partition(PAIR))
        if not sep or not key or not value:
            raise FormatError(f"expected comma-separated key{PAIR}value pairs, bad item "
                              f"{item!r}", item=item)
        pairs.append((key, value))
    return pairs


def _join(pairs: Iterable[tuple[str, str]]) -> str:
    return ITEMS.join(f"{key}{PAIR}{value}" for key, value in pairs)


# --- GATEWAY_ADAPTERS: served name = directory, in order (the order gives vLLM's lora ids) ----
def format_adapters(adapters: Iterable[tuple[str, str]]) -> str:
    """``name=directory,...`` in the given order."""
    return _join(adapters)


def parse_adapters(text: str) -> list[tuple[str, str]]:
    """``[(name, directory), ...]`` in order; FormatError for a bad pair."""
    return _pairs(text)


# --- GATEWAY_ROUTING_TABLE: intent = adapter or "base" ----------------------------------------
def format_routing(table: Mapping[str, str]) -> str:
    """``intent=target,...`` sorted by intent (stable text: a reviewer's diff shows changes)."""
    return _join(sorted(table.items()))


def parse_routing(text: str) -> list[tuple[str, str]]:
    """``[(intent, target), ...]``; FormatError for a bad pair."""
    return _pairs(text)


# --- GATEWAY_LOCALE_ROUTES: locale : adapter = replacement [, ...] [; locale : ...] ------------
def format_locale_routes(routes: Mapping[str, Mapping[str, str]]) -> str:
    """``locale:source=replacement,...;...`` sorted by locale, then source."""
    return LOCALE_GROUPS.join(
        f"{locale}{LOCALE_SEPARATOR}{_join(sorted(table.items()))}"
        for locale, table in sorted(routes.items()) if table)


def parse_locale_routes(text: str) -> dict[str, dict[str, str]]:
    """``{normalized locale: {source: replacement}}``; FormatError naming a bad item.

    A group may also continue the previous locale without repeating it
    (``ja-JP:manga=manga-ja,support=support-ja``).
    """
    routes: dict[str, dict[str, str]] = {}
    for group in (part.strip() for part in text.split(LOCALE_GROUPS)):
        locale: str | None = None
        for item in (part.strip() for part in group.split(ITEMS)):
            if not item:
                continue
            if LOCALE_SEPARATOR in item:
                locale, _, item = (part.strip() for part in item.partition(LOCALE_SEPARATOR))
            source, sep, replacement = (part.strip() for part in item.partition(PAIR))
            if locale is None or not LOCALE_PATTERN.match(locale) or not sep or not source \
                    or not replacement:
                raise FormatError(f"bad item {item!r}", item=item)
            routes.setdefault(normalize_locale(locale), {})[source] = replacement
    return routes
