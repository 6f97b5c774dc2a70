"""Per-request lines, gauges and events: EMF documents that satisfy the metrics contract."""

from __future__ import annotations

import json
from typing import Any

import metrics_contract as mc
from gateway.telemetry import RequestRecord, Telemetry


def assert_valid_emf(document: dict[str, Any]) -> None:
    """CloudWatch's rules: every declared metric and dimension is a top-level member."""
    directive = document["_aws"]["CloudWatchMetrics"][0]
    assert directive["Namespace"] == mc.NAMESPACE
    for dimension in directive["Dimensions"][0]:
        assert isinstance(document[dimension], str)
    for definition in directive["Metrics"]:
        spec = mc.metric(definition["Name"])
        assert definition["Unit"] == spec.unit.value
        assert isinstance(document[definition["Name"]], float)
        assert set(spec.dimensions) == set(directive["Dimensions"][0])


def telemetry() -> tuple[Telemetry, list[str]]:
    """A Telemetry writing to a list; the monotonic clock reads 10 s at the first request end."""
    lines: list[str] = []
    clock = iter(range(10, 10_000))
    sink = Telemetry(endpoint_name="ep", variant_name="AllTraffic", sink=lines.append,
                     wall_clock=lambda: 1_800_000_000.0, monotonic=lambda: float(next(clock)))
    return sink, lines


def parsed(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines]


def test_completed_request_line_carries_metrics_and_log_fields() -> None:
    sink, lines = telemetry()
    record = RequestRecord(request_id="chatcmpl-1", path="/invocations", started=9.0,
                           reached_engine=True, served_name="manga", bucket="M",
                           prompt_tokens=900, completion_tokens=40, truncated=True,
                           dropped_turns=12, queue_wait_s=0.002, ttft_s=0.05)
    sink.request(record)
    (document,) = parsed(lines)
    assert_valid_emf(document)
    assert document["Requests"] == 1.0
    assert document["PromptTokens"] == 900.0
    assert document["ContextTruncations"] == 1.0
    assert document["DroppedTurns"] == 12.0
    assert document["Fallbacks"] == 0.0
    assert document["TimeToFirstToken"] == 50.0
    assert document["RequestLatency"] == 1000.0
    assert document["request_id"] == "chatcmpl-1"
    assert document["event"] == "request"
    assert document["EndpointName"] == "ep"
    assert document["_aws"]["Timestamp"] == 1_800_000_000_000


def test_rejection_is_counted_per_bucket() -> None:
    sink, lines = telemetry()
    sink.request(RequestRecord(request_id="r", path="/invocations", started=0.0, status=429,
                               outcome="rejected", bucket="XL", error_code="kv_pool"))
    (document,) = parsed(lines)
    assert_valid_emf(document)
    assert document["AdmissionRejections"] == 1.0
    assert document["Bucket"] == "XL"


def test_client_error_fallback_and_warmup_lines() -> None:
    sink, lines = telemetry()
    sink.request(RequestRecord(request_id="a", path="/invocations", started=0.0, status=400,
                               outcome="client_error", error_param="messages[0].role"))
    sink.request(RequestRecord(request_id="b", path="/invocations", started=0.0,
                               outcome="fallback", reached_engine=True,
                               fallback_reason="engine_out_of_memory"))
    sink.request(RequestRecord(request_id="c", path="/invocations", started=0.0, warmup=True))
    client, fallback, warmup = parsed(lines)
    assert_valid_emf(client)
    assert client["ClientErrors"] == 1.0
    assert client["error_param"] == "messages[0].role"
    assert_valid_emf(fallback)
    assert fallback["Fallbacks"] == 1.0
    assert fallback["Requests"] == 1.0
    assert "_aws" not in warmup  # warmup is logged, never counted
    assert warmup["warmup"] is True


def test_gauges_publish_kv_usage_in_percent() -> None:
    sink, lines = telemetry()
    sink.gauges(kv_cache_usage=0.42, running=7, waiting=3, preemptions=2, breaker_value=2)
    (document,) = parsed(lines)
    assert_valid_emf(document)
    assert document["KVCacheUsage"] == 42.0
    assert document["BreakerState"] == 2.0
    assert document["WaitingRequests"] == 3.0


def test_time_per_output_token_is_the_pace_after_the_first_token() -> None:
    sink, lines = telemetry()
    record = RequestRecord(request_id="chatcmpl-2", path="/invocations", started=9.0,
                           reached_engine=True, bucket="M", prompt_tokens=300,
                           completion_tokens=41, ttft_s=0.2)
    record.mark_tokens(100.0, 1)      # the first token: starts the clock, not counted
    record.mark_tokens(100.4, 0)      # an empty delta changes nothing
    for step in range(1, 21):         # 40 more tokens, two per delta, 50 ms apart
        record.mark_tokens(100.0 + 0.05 * step, 2)
    assert record.tpot_s is not None and abs(record.tpot_s - 0.025) < 1e-9
    sink.request(record)
    (document,) = parsed(lines)
    assert_valid_emf(document)
    assert abs(document["TimePerOutputToken"] - 25.0) < 1e-6
    assert abs(document["tpot_ms"] - 25.0) < 1e-3


def test_a_single_token_answer_has_no_pace() -> None:
    sink, lines = telemetry()
    record = RequestRecord(request_id="chatcmpl-3", path="/invocations", started=9.0,
                           reached_engine=True, bucket="S", prompt_tokens=10,
                           completion_tokens=1, ttft_s=0.1)
    record.mark_tokens(5.0, 1)
    assert record.tpot_s is None
    sink.request(record)
    (document,) = parsed(lines)
    assert "TimePerOutputToken" not in document and "tpot_ms" not in document
    assert document["TimeToFirstToken"] == 100.0
