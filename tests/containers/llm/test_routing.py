"""Adapter routing: explicit model, intent table, locale override, unknown models."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.routing import AdapterRouter, UnknownModel
from gateway.settings import load_settings


@pytest.fixture
def router() -> AdapterRouter:
    gateway = load_settings({"GATEWAY_MODEL_DIR": "/opt/ml/model"}).gateway
    return AdapterRouter(served_model_name=gateway.served_model_name, adapters=gateway.adapters,
                         adapters_dir=gateway.adapters_dir, routing_table=gateway.routing_table,
                         locale_routes=gateway.locale_routes)


@pytest.mark.parametrize(
    ("intent", "locale", "expected"),
    [
        ("product_question", None, "manga"),
        ("recommendation", "en-US", "manga"),
        ("discovery", None, "manga"),
        ("order_tracking", None, "support"),
        ("return_request", "ja-JP", "support"),  # no Japanese support adapter: stays
        ("escalation", None, "support"),
        ("chitchat", None, "mangaassist-base"),
        ("faq", "ja-JP", "mangaassist-base"),
        ("recommendation", "ja-JP", "manga-ja"),
        ("product_question", "ja-jp", "manga-ja"),  # locale case does not matter
        (None, "ja-JP", "mangaassist-base"),
    ],
)
def test_intent_and_locale_pick_the_adapter(router: AdapterRouter, intent: str | None,
                                            locale: str | None, expected: str) -> None:
    decision = router.resolve(None, intent, locale)
    assert decision.served_name == expected
    assert (decision.adapter is None) == (expected == "mangaassist-base")
    assert router.resolve("auto", intent, locale).served_name == expected


def test_explicit_model_wins_over_intent_and_locale(router: AdapterRouter) -> None:
    decision = router.resolve("manga", "order_tracking", "ja-JP")
    assert decision.served_name == "manga"
    assert decision.reason == "model"
    base = router.resolve("mangaassist-base", "recommendation", "ja-JP")
    assert base.adapter is None
    assert base.reason == "model"


def test_adapters_get_positive_ids_and_paths(router: AdapterRouter) -> None:
    refs = router.adapters
    assert [ref.int_id for ref in refs.values()] == [1, 2, 3]  # vLLM needs lora_int_id > 0
    assert refs["manga-ja"].path == str(Path("/opt/ml/model/adapters/jp_translation"))


def test_unknown_model_names_the_choices(router: AdapterRouter) -> None:
    with pytest.raises(UnknownModel) as caught:
        router.resolve("gpt-4o", None, None)
    message = str(caught.value)
    assert "'gpt-4o'" in message
    assert "mangaassist-base, manga, support, manga-ja" in message
