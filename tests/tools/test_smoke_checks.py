"""The smoke test's judgement of a streamed answer, on recorded events (no endpoint).

tests/tools/test_smoke.py runs the whole smoke test against the real containers (a clean stream,
one cut off mid-way); these cases pin every other way a stream can be wrong, each with the line a
person reads."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stacks.settings import SmokeSettings
from tools.smoke_checks import StreamRecord, judge_stream

SMOKE = SmokeSettings(llm_latency_ms=5000, llm_time_to_first_token_ms=1000)


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
    return json.dumps({"object": "chat.completion.chunk",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                       **extra})


GOOD = [chunk({"role": "assistant", "content": ""}), chunk({"content": "ONE PIECE"}),
        chunk({"content": " is at volume 110."}), chunk({}, "stop"), "[DONE]"]


def record(data: list[str], **changes: Any) -> StreamRecord:
    return StreamRecord(**{"data": data, "first_content_ms": 250.0, "total_ms": 900.0,
                           **changes})


def test_a_clean_stream_passes_with_its_figures() -> None:
    check = judge_stream("llm", record(GOOD), SMOKE)
    assert check.passed
    assert check.detail == "4 chunks, 27 chars, finish stop"
    assert (check.name, check.latency_ms, check.ttft_ms) == ("stream", 900.0, 250.0)


@pytest.mark.parametrize(("data", "changes", "detail"), [
    (GOOD[:2], {"error": "ReadTimeoutError"},
     "stream broke off after 2 events: ReadTimeoutError"),
    (GOOD[:3], {"leftover": b"data: {"},
     "stream broke off: 3 events and no [DONE] (then 7 bytes without a newline)"),
    ([], {}, "stream broke off: 0 events and no [DONE]"),
    ([GOOD[0], "[DONE]", *GOOD[1:]], {}, "events after [DONE]"),
    ([GOOD[0], "{not json", "[DONE]"], {}, "event 1 is not JSON: '{not json'"),
    ([GOOD[0], "5", "[DONE]"], {}, "an event is not a chat.completion.chunk"),
    ([GOOD[0], json.dumps({"object": "chat.completion", "choices": []}), "[DONE]"], {},
     "an event is not a chat.completion.chunk"),
    (GOOD[1:], {}, "the first chunk has no assistant role"),
    ([*GOOD[:2], chunk({}, "stop", mangaassist={"fallback": {"reason": "oom",
                                                            "detail": "KV cache full"}}),
      "[DONE]"], {}, "fallback answer (oom): KV cache full"),
    ([GOOD[0], chunk({"content": "  "}), chunk({}, "stop"), "[DONE]"], {},
     "no content in the stream"),
    ([*GOOD[:3], "[DONE]"], {}, "no finish_reason stop/length (got [])"),
    ([*GOOD[:3], chunk({}, "abort"), "[DONE]"], {},
     "no finish_reason stop/length (got ['abort'])"),
    (GOOD, {"first_content_ms": None},
     "time to first token None ms > 1000 ms (smoke.llm_time_to_first_token_ms)"),
    (GOOD, {"first_content_ms": 1500.0},
     "time to first token 1500.0 ms > 1000 ms (smoke.llm_time_to_first_token_ms)"),
    (GOOD, {"total_ms": 7000.0}, "7000 ms > 5000 ms"),
])
def test_a_wrong_stream_fails_saying_what_is_wrong(data: list[str], changes: dict[str, Any],
                                                   detail: str) -> None:
    check = judge_stream("llm", record(data, **changes), SMOKE)
    assert not check.passed
    assert check.detail == detail
