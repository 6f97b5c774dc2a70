"""At engine start the gateway checks its prompt rendering against the engine tokenizer's."""

from __future__ import annotations

import json
from typing import Any

from gateway.tokenizer import ChatTurn


class RenderingEngine:
    def __init__(self, ids: list[int] | None = None, error: Exception | None = None) -> None:
        self.ids, self.error = ids, error

    def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        if self.error is not None:
            raise self.error
        assert self.ids is not None
        return self.ids


def events(lines: list[str], name: str) -> list[dict[str, Any]]:
    return [record for record in map(json.loads, lines) if record.get("event") == name]


def probe_ids(runtime: Any) -> list[int]:
    turns = [ChatTurn(role, content) for role, content in runtime.CHAT_PROBE]
    return list(runtime.tokenizer.render_prompt(turns).token_ids)


def test_same_rendering_is_logged_as_a_match(make_runtime: Any) -> None:
    runtime, lines = make_runtime()
    runtime._check_chat_rendering(RenderingEngine(probe_ids(runtime)))
    (record,) = events(lines, "chat_template_check")
    assert record["matches"] is True


def test_a_different_rendering_warns_with_where_it_differs(make_runtime: Any) -> None:
    runtime, lines = make_runtime()
    ids = probe_ids(runtime)
    runtime._check_chat_rendering(RenderingEngine([*ids[:5], -1, *ids[6:]]))
    (record,) = events(lines, "chat_template_check")
    assert record["level"] == "warning"
    assert record["matches"] is False
    assert record["first_difference_at"] == 5


def test_a_failing_check_is_reported_not_fatal(make_runtime: Any) -> None:
    runtime, lines = make_runtime()
    runtime._check_chat_rendering(RenderingEngine(error=RuntimeError("no chat template")))
    (record,) = events(lines, "chat_template_check_failed")
    assert "no chat template" in record["error"]


def test_engines_without_rendering_are_not_checked(make_runtime: Any) -> None:
    runtime, lines = make_runtime()
    runtime._check_chat_rendering(object())
    assert not events(lines, "chat_template_check")
