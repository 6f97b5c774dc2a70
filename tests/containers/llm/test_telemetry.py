"""Per-request lines, gauges and events: EMF documents that satisfy the metrics contract."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import metrics_contract as mc
from gateway.telemetry import RequestRecord, Telemetry


def assert_valid_emf(document: dict[str, Any]) -> None:
    """CloudWatch's rules: every declared metric and dimension is a top-level member (in every
    directive: the first response rides in the request's line on its own dimension set)."""
    for directive in document["_aws"]["CloudWatchMetrics"]:
        assert directive["Namespace"] == mc.NAMESPACE
        for dimension in directive["Dimensions"][0]:
            assert isinstance(document[dimension], str)
        for definition in directive["Metrics"]:
            spec = mc.metric(definition["Name"])
            assert definition["Unit"] == spec.unit.value
            assert isinstance(document[definition["Name"]], float)
            assert set(spec.dimensions) == set(directive["Dimensions"][0])


def metric_dimensions(document: dict[str, Any], name: str) -> dict[str, str]:
    """The dimensions ``name`` is published with in ``document`` (KeyError when it is not)."""
    for directive in document["_aws"]["CloudWatchMetrics"]:
        if any(m["Name"] == name for m in directive["Metrics"]):
            return {key: document[key] for key in directive["Dimensions"][0]}
    raise KeyError(name)


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


# --- FirstResponseLatency (docs/design-decisions.md#p999-first-response) ---------------------
def test_a_streamed_answer_first_responds_at_its_first_token() -> None:
    """Arrival (``started``) to the first token's chunk: the queue wait and the prefill, not
    the rest of the stream; published per Mode beside the request's other metrics."""
    sink, lines = telemetry()     # the request ends at 10 s on the monotonic clock
    record = RequestRecord(request_id="s", path="/invocations", started=6.0, stream=True,
                           reached_engine=True, bucket="M", completion_tokens=3,
                           queue_wait_s=0.5, ttft_s=0.7)
    record.mark_tokens(7.25, 1)
    record.mark_tokens(9.5, 2)
    sink.request(record)
    (document,) = parsed(lines)
    assert_valid_emf(document)
    assert document["FirstResponseLatency"] == 1250.0
    assert document["first_response_ms"] == 1250.0
    assert document["RequestLatency"] == 4000.0
    assert metric_dimensions(document, "FirstResponseLatency") == {
        "EndpointName": "ep", "VariantName": "AllTraffic", "Mode": "streamed"}
    assert metric_dimensions(document, "Requests") == {"EndpointName": "ep",
                                                       "VariantName": "AllTraffic"}


def test_a_non_streamed_answer_first_responds_with_the_whole_answer() -> None:
    sink, lines = telemetry()
    record = RequestRecord(request_id="w", path="/invocations", started=4.0, stream=False,
                           reached_engine=True, bucket="S", completion_tokens=2, ttft_s=0.2)
    record.mark_tokens(4.3, 1)    # tokens arrive, but the caller sees nothing until the end
    record.mark_tokens(5.0, 1)
    sink.request(record)
    (document,) = parsed(lines)
    assert_valid_emf(document)
    assert document["FirstResponseLatency"] == document["RequestLatency"] == 6000.0
    assert metric_dimensions(document, "FirstResponseLatency")["Mode"] == "whole"


def test_a_stream_without_a_token_first_responds_when_it_ends() -> None:
    """A fallback (the engine died before any token) reaches the caller at the end."""
    sink, lines = telemetry()
    sink.request(RequestRecord(request_id="f", path="/invocations", started=7.0, stream=True,
                               outcome="fallback", reached_engine=True,
                               fallback_reason="engine_dead"))
    (document,) = parsed(lines)
    assert document["FirstResponseLatency"] == 3000.0
    assert metric_dimensions(document, "FirstResponseLatency")["Mode"] == "streamed"


def test_a_refusal_counts_at_the_time_the_caller_waited_for_it() -> None:
    """A 429/503 is the caller's first response: a fast one counts as fast, and one that waited
    for admission counts its wait. One line still: the rejection on its Bucket, the first
    response on its Mode."""
    sink, lines = telemetry()
    sink.request(RequestRecord(request_id="r", path="/invocations", started=0.0, status=503,
                               outcome="rejected", bucket="L", stream=True,
                               error_code="engine_unavailable"))
    (document,) = parsed(lines)
    assert_valid_emf(document)
    assert document["AdmissionRejections"] == 1.0
    assert document["FirstResponseLatency"] == 10_000.0
    assert metric_dimensions(document, "AdmissionRejections")["Bucket"] == "L"
    assert metric_dimensions(document, "FirstResponseLatency") == {
        "EndpointName": "ep", "VariantName": "AllTraffic", "Mode": "streamed"}
    assert "Bucket" not in metric_dimensions(document, "FirstResponseLatency")


def test_a_line_written_after_the_answer_counts_the_wait_until_the_answer() -> None:
    """A refusal's line is written after the burst it came in (gateway.api.edge.StartGate.
    settled): its latency and first response end when the answer went out (``ended``), not
    when the line is written (the clock reads 10 s then)."""
    sink, lines = telemetry()
    sink.request(RequestRecord(request_id="r", path="/invocations", started=1.0, status=429,
                               outcome="rejected", bucket="Unsized"), ended=1.5)
    (document,) = parsed(lines)
    assert document["latency_ms"] == 500.0
    assert document["FirstResponseLatency"] == 500.0


def test_client_errors_and_warmup_have_no_first_response() -> None:
    sink, lines = telemetry()
    sink.request(RequestRecord(request_id="a", path="/invocations", started=0.0, status=400,
                               outcome="client_error"))
    warm = RequestRecord(request_id="b", path="/invocations", started=0.0, stream=True,
                         warmup=True, reached_engine=True, ttft_s=0.1)
    warm.mark_tokens(0.5, 1)
    sink.request(warm)
    client, warmup = parsed(lines)
    assert "FirstResponseLatency" not in client and "first_response_ms" not in client
    assert "_aws" not in warmup and "FirstResponseLatency" not in warmup


def test_the_p999_alarm_reads_what_the_gateway_emits() -> None:
    """The alarm's metric, statistic source and dimensions are those of the request line: the
    contract's spec, and the Mode value the rule fixes is one a streamed request carries."""
    from stacks.alarm_rules import first_response_rule
    from stacks.settings import EndpointAlarmSettings

    rule = first_response_rule(EndpointAlarmSettings())
    assert rule.metric is mc.FIRST_RESPONSE_LATENCY
    sink, lines = telemetry()
    record = RequestRecord(request_id="s", path="/invocations", started=9.5, stream=True,
                           reached_engine=True, bucket="S", ttft_s=0.1)
    record.mark_tokens(9.6, 1)
    sink.request(record)
    (document,) = parsed(lines)
    emitted = metric_dimensions(document, rule.metric.name)
    assert set(emitted) == set(rule.metric.dimensions)
    assert {key: emitted[key] for key in rule.dimensions} == dict(rule.dimensions)


def test_the_gateway_guide_lists_every_metric_the_gateway_emits() -> None:
    """docs/gateway.md's "Metrics and logs" table names each metric the contract says the
    gateway emits (FirstResponseLatency included), and no gateway metric the contract lacks."""
    guide = (Path(__file__).resolve().parents[3] / "docs" / "gateway.md").read_text("utf-8")
    section = guide[guide.index("## Metrics and logs"):]
    table = [line for line in section[:section.index("\n## ", 5)].splitlines()
             if line.startswith("| `")]
    named = {name for line in table for name in re.findall(r"`([A-Z][A-Za-z]+)`", line)}
    emitted = {spec.name for spec in mc.ALL_METRICS if spec.emitter is mc.Emitter.GATEWAY}
    dimensions = {key for spec in mc.ALL_METRICS for key in spec.dimensions}
    assert "FirstResponseLatency" in emitted
    assert emitted - named == set()
    assert named - emitted - dimensions == set()
