"""Fleet routing weighed (capacity_model/routing.py, routing_plan.py) and AWS's rules for it
(stacks/endpoint_routing.py, the settings): small windows, so the tests stay fast."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from capacity_model import LlmCapacity
from capacity_model.routing import Conversations, Outcome, Policy, RoutingError, Window, route
from capacity_model.routing_plan import prefix_length, winner
from stacks.endpoint_routing import LEAST_OUTSTANDING, routing_choice
from stacks.model_endpoint import _routing_config
from stacks.settings import REPO_ROOT, SettingsError, parse_settings

TALK = Conversations(turns=10, think_time_s=20.0, request_s=5.0, new_tokens_per_turn=300.0,
                     history_tokens_per_turn=200.0, history_cap_tokens=2048.0, retention=1.0)


def _flat_ttft(batch: int, uncached: float) -> float:
    return batch + uncached / 10


def _window(**overrides: Any) -> Window:
    values: dict[str, Any] = {"name": "test", "duration_s": 300.0,
                              "requests_per_min": lambda _t: 240.0,
                              "instances_at": lambda _t: 4}
    values.update(overrides)
    return Window(**values)


def _run(policy: Policy, **window: Any) -> Outcome:
    return route(_window(**window), TALK, policy, cap=20, ttft_ms=_flat_ttft, seed=7)


def test_pinned_conversations_find_their_prefix_and_a_shared_key_does_not_spread() -> None:
    """With full retention and a long TTL, sessions keep every later turn on its instance; a
    prefix covering the conversation does too (below the threshold); a prefix covering only the
    shared system prompt sends everyone to one instance until it is full."""
    sessions = _run(Policy("least_outstanding_sessions", session_ttl_s=1e6))
    prefix = _run(Policy("prefix_aware", concurrency_threshold=1000))
    shared = _run(Policy("prefix_aware", concurrency_threshold=20,
                         prefix_covers_conversation=False))
    assert sessions.prefix_hit_share == pytest.approx(1.0)
    assert prefix.prefix_hit_share == pytest.approx(1.0)
    assert shared.prefix_hit_share < 0.9
    assert shared.in_flight_p99_over_mean > prefix.in_flight_p99_over_mean or (
        shared.arrivals_at_cap_share > prefix.arrivals_at_cap_share)


def test_a_short_ttl_re_opens_sessions_and_a_lost_instance_re_prefills() -> None:
    short = _run(Policy("least_outstanding_sessions", session_ttl_s=30.0))
    assert short.prefix_hit_share < 0.9
    lost = _run(Policy("least_outstanding_sessions", session_ttl_s=1e6), removed_at_s=150.0)
    assert lost.reprefilled_after_removal > 0
    assert lost.prefix_hit_share < 1.0


def test_the_threshold_overflows_to_a_less_loaded_instance() -> None:
    tight = _run(Policy("prefix_aware", concurrency_threshold=2))
    assert tight.prefix_hit_share < 1.0
    with pytest.raises(RoutingError, match="cap"):
        route(_window(), TALK, Policy("prefix_aware"), cap=0, ttft_ms=_flat_ttft)


def test_the_challenger_must_dominate() -> None:
    base = Outcome("least_outstanding_sessions", 100, 0.40, 1.3, 0.10, 1000.0, 0)
    better = Outcome("prefix_aware", 100, 0.45, 1.2, 0.05, 990.0, 0)
    mixed = Outcome("prefix_aware", 100, 0.35, 1.2, 0.05, 990.0, 0)
    assert winner((("w", (base, better)),))[0] == "prefix_aware"
    assert winner((("w", (base, mixed)),))[0] == "least_outstanding_sessions"
    assert winner((("w", (base, base)),))[0] == "least_outstanding_sessions"


def test_aws_rules_name_the_field_value_and_what_is_accepted() -> None:
    assert routing_choice("least_outstanding", sessions=True, prefix_length=0,
                          concurrency_threshold=0) == LEAST_OUTSTANDING
    choice = routing_choice("prefix_aware", sessions=False, prefix_length=2448,
                            concurrency_threshold=39)
    prefix_aware = _routing_config(choice)
    assert prefix_aware.routing_strategy == "PREFIX_AWARE"
    assert (prefix_aware.prefix_aware_routing_config.prefix_length,
            prefix_aware.prefix_aware_routing_config.concurrency_threshold) == (2448, 39)
    least = _routing_config(LEAST_OUTSTANDING)
    assert (least.routing_strategy, least.prefix_aware_routing_config) == (
        "LEAST_OUTSTANDING_REQUESTS", None)
    for kwargs, message in (
            ({"sessions": True, "prefix_length": 2448, "concurrency_threshold": 39},
             "llm.capacity.sessions: true"),
            ({"sessions": False, "prefix_length": 2448, "concurrency_threshold": 1025},
             "ConcurrencyThreshold .*: 1025; accepted: 1 to 1024"),
            ({"sessions": False, "prefix_length": 1023, "concurrency_threshold": 39},
             "PrefixLength: 1023; accepted: 1,024 to 65,536")):
        with pytest.raises(ValueError, match=message):
            routing_choice("prefix_aware", **kwargs)
    with pytest.raises(ValueError, match="accepted: least_outstanding, prefix_aware"):
        routing_choice("random", sessions=False, prefix_length=2048, concurrency_threshold=1)


def test_settings_refuse_prefix_aware_with_sessions() -> None:
    data = yaml.safe_load((REPO_ROOT / "config" / "prod.yaml").read_text(encoding="utf-8"))
    data["llm"]["routing_strategy"] = "prefix_aware"
    with pytest.raises(SettingsError, match=r"routing_strategy: 'prefix_aware' with "
                                            r"capacity\.sessions: true"):
        parse_settings(data, source="prod (edited)")


def test_prod_routes_as_the_comparison_adopted(prod: LlmCapacity) -> None:
    """Production's setting is the strategy docs/scaling.md's comparison adopted, and the
    prefix length covers the system prompt and the conversation's first message."""
    data = yaml.safe_load((REPO_ROOT / "config" / "prod.yaml").read_text(encoding="utf-8"))
    doc = (REPO_ROOT / "docs" / "scaling.md").read_text(encoding="utf-8")
    adopted = "least_outstanding_sessions" if data["llm"]["routing_strategy"] == (
        "least_outstanding") else "prefix_aware"
    assert f"  adopted: {adopted} (" in doc
    conversation = prod.conversation
    assert prefix_length(prod) >= 4 * (conversation.system_tokens + conversation.tokens_per_turn)


def test_scaling_md_quotes_the_comparison_as_printed(prod: LlmCapacity) -> None:
    from capacity_model.routing_plan import compare, format_comparison

    doc = (REPO_ROOT / "docs" / "scaling.md").read_text(encoding="utf-8").splitlines()
    printed = format_comparison(compare(prod))
    assert [line for line in printed if line not in doc] == []
