"""Metrics and logs: CloudWatch EMF documents and JSON log lines on stdout.

SageMaker ships container stdout to CloudWatch Logs, which extracts metrics from EMF documents.
Every metric goes through :func:`metrics_contract.emf_document`, so a metric name or dimension
set the alarms do not know cannot be emitted. (The aws-embedded-metrics library would build its
own documents around that check, so it is not used here.)

* One line per request: an EMF document whose properties are the request's structured log
  (request id, adapter, bucket, tokens, truncation, outcome, latency, time to first token and
  time per output token ...). Never the content. Its ``FirstResponseLatency`` (arrival to the
  first answer the caller gets, per ``Mode``) rides in the same line as a second metric
  directive, on its own dimension set.
* Event lines: OOM circuit trips, breaker transitions, engine restarts (EMF + log fields).
* A gauge line every ``GATEWAY_METRICS_INTERVAL_S``: KV usage, running / waiting, preemptions,
  breaker state.
* Plain JSON log lines (``"event": ...``) for everything else (start-up, warmup, errors).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import metrics_contract as mc
from request_buckets import UNSIZED

Sink = Callable[[str], None]


def stdout_sink(line: str) -> None:
    """Write one line to stdout and flush (a killed container must not lose buffered lines)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@dataclass
class RequestRecord:
    """Everything the per-request line reports; filled in as the request moves along."""

    request_id: str
    path: str
    started: float
    stream: bool = False
    status: int = 200
    outcome: str = "completed"
    """completed | fallback | rejected | client_error | server_error | aborted"""
    reached_engine: bool = False
    served_name: str | None = None
    route_reason: str | None = None
    intent: str | None = None
    locale: str | None = None
    bucket: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens the engine's prefix cache served (the rest it prefilled)."""
    completion_tokens: int = 0
    truncated: bool = False
    dropped_turns: int = 0
    rag_chunks_dropped: int = 0
    queue_wait_s: float | None = None
    screened_tokens: float | None = None
    """The prompt tokens the arrival screen counted it at (None: not screened)."""
    admitted_by: str | None = None
    """``floor``: admitted by the prefill valve's floor (nothing else waited for a first token)
    although the backlog with it was over the cap (gateway.admission.valve)."""
    refused_while_idle: bool = False
    """Refused by the valve while the engine was nearly idle (``RefusalsWhileIdle``)."""
    ttft_s: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    tokens_after_first: int = 0
    finish_reason: str | None = None
    fallback_reason: str | None = None
    breaker_state: str | None = None
    engine_generation: int | None = None
    error_code: str | None = None
    error_param: str | None = None
    error_message: str | None = None
    warmup: bool = False
    session_id: str | None = None
    session_state: str | None = None
    """What the request's SageMaker session header meant here (gateway.sessions.SessionState)."""

    def mark_tokens(self, now: float, count: int) -> None:
        """Note that ``count`` tokens arrived at ``now`` (monotonic): the stream's pace."""
        if count <= 0:
            return
        if self.first_token_at is None:
            self.first_token_at = now
        else:
            self.tokens_after_first += count
        self.last_token_at = now

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: None until a second token arrived."""
        if (self.first_token_at is None or self.last_token_at is None
                or self.tokens_after_first < 1):
            return None
        return (self.last_token_at - self.first_token_at) / self.tokens_after_first

    def first_response_s(self, latency_s: float) -> float | None:
        """Seconds from arrival to the first answer the caller got (``FirstResponseLatency``),
        or None for a request that does not count.

        A streamed request that produced a token: its first token (``first_token_at``, the
        chunk that carries it; the role chunk before it carries no answer). Any other request —
        non-streamed (the whole response is the first thing the caller gets), a stream that
        ended without a token (its fallback, error or last chunk), a refusal (429/503: the
        caller waited that long to be told), a gateway fault, a caller gone before its first
        token (a lower bound of its wait) — its whole ``latency_s``. Client errors (4xx other
        than shedding: the caller's mistake, answered before any wait) and warmup requests do
        not count (docs/design-decisions.md#p999-first-response).
        """
        if self.warmup or self.outcome == "client_error":
            return None
        if self.stream and self.first_token_at is not None:
            return max(0.0, self.first_token_at - self.started)
        return latency_s

    @property
    def response_mode(self) -> str:
        """The ``Mode`` dimension of ``FirstResponseLatency``: streamed or whole."""
        return "streamed" if self.stream else "whole"

    def log_fields(self, latency_s: float) -> dict[str, Any]:
        """The structured-log view: non-empty fields, latencies in milliseconds."""
        fields: dict[str, Any] = {
            "event": "request",
            "request_id": self.request_id,
            "path": self.path,
            "status": self.status,
            "outcome": self.outcome,
            "stream": self.stream,
            "latency_ms": round(latency_s * 1000, 3),
        }
        optional = {
            "model": self.served_name, "route": self.route_reason, "intent": self.intent,
            "locale": self.locale, "bucket": self.bucket, "finish_reason": self.finish_reason,
            "fallback_reason": self.fallback_reason, "breaker": self.breaker_state,
            "engine_generation": self.engine_generation, "error_code": self.error_code,
            "error_param": self.error_param, "error": self.error_message,
            "session_id": self.session_id, "session": self.session_state,
        }
        fields.update({key: value for key, value in optional.items() if value is not None})
        if self.reached_engine or self.prompt_tokens:
            fields.update(prompt_tokens=self.prompt_tokens,
                          cached_tokens=self.cached_tokens,
                          completion_tokens=self.completion_tokens,
                          truncated=self.truncated, dropped_turns=self.dropped_turns,
                          rag_chunks_dropped=self.rag_chunks_dropped)
        if self.queue_wait_s is not None:
            fields["queue_wait_ms"] = round(self.queue_wait_s * 1000, 3)
        if self.ttft_s is not None:
            fields["ttft_ms"] = round(self.ttft_s * 1000, 3)
        first_response_s = self.first_response_s(latency_s)
        if first_response_s is not None:
            fields["first_response_ms"] = round(first_response_s * 1000, 3)
        if self.tpot_s is not None:
            fields["tpot_ms"] = round(self.tpot_s * 1000, 3)
        if self.admitted_by is not None:
            fields["admitted_by"] = self.admitted_by
        if self.refused_while_idle:
            fields["refused_while_idle"] = True
        if self.warmup:
            fields["warmup"] = True
        return fields


class Telemetry:
    """Builds and writes the lines described in the module docstring."""

    def __init__(
        self,
        *,
        endpoint_name: str,
        variant_name: str,
        sink: Sink = stdout_sink,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.dimensions = {"EndpointName": endpoint_name, "VariantName": variant_name}
        self._sink = sink
        self._wall_clock = wall_clock
        self.monotonic = monotonic

    def _write(self, document: Mapping[str, Any]) -> None:
        self._sink(json.dumps(document, ensure_ascii=True, separators=(",", ":"), default=str))

    def _timestamp_ms(self) -> int:
        return int(self._wall_clock() * 1000)

    def log(self, event: str, *, level: str = "info", **fields: Any) -> None:
        """A plain JSON log line."""
        self._write({"timestamp_ms": self._timestamp_ms(), "level": level, "event": event,
                     **fields})

    def emit(self, values: Mapping[mc.MetricSpec, float], *,
             dimensions: Mapping[str, str] | None = None,
             also: Sequence[mc.MetricGroup] = (), **properties: Any) -> None:
        """One EMF document (validated by the metrics contract) with log properties; ``also``:
        further metrics on their own dimension sets in the same document."""
        document = mc.emf_document(
            values, dimensions if dimensions is not None else self.dimensions,
            timestamp_ms=self._timestamp_ms(), properties=properties, also=also,
        )
        self._write(document)

    def request(self, record: RequestRecord, *, ended: float | None = None) -> None:
        """The one line for a finished request (metrics chosen by outcome); ``ended``: when
        its answer went out (this clock's; None: now), for a line written after it."""
        latency_s = (self.monotonic() if ended is None else ended) - record.started
        fields = record.log_fields(latency_s)
        if record.warmup:
            self.log("request", **{k: v for k, v in fields.items() if k != "event"})
            return
        first_response = self._first_response(record, latency_s)
        if record.outcome == "rejected":
            self.emit({mc.ADMISSION_REJECTIONS: 1},
                      dimensions={**self.dimensions, "Bucket": record.bucket or UNSIZED},
                      also=first_response, **fields)
            if record.refused_while_idle:
                self.emit({mc.REFUSALS_WHILE_IDLE: 1}, event="refused_while_idle",
                          request_id=record.request_id, bucket=record.bucket)
            return
        values: dict[mc.MetricSpec, float] = {mc.REQUEST_LATENCY: latency_s * 1000}
        if record.session_state in ("expired", "unknown"):
            values[mc.SESSION_MISSES] = 1
        if record.outcome == "client_error":
            values[mc.CLIENT_ERRORS] = 1
        elif record.reached_engine:
            values.update({
                mc.REQUESTS: 1,
                mc.PROMPT_TOKENS: record.prompt_tokens,
                mc.CACHED_PROMPT_TOKENS: record.cached_tokens,
                mc.COMPLETION_TOKENS: record.completion_tokens,
                mc.CONTEXT_TRUNCATIONS: 1 if record.truncated else 0,
                mc.DROPPED_TURNS: record.dropped_turns,
                mc.FALLBACKS: 1 if record.outcome == "fallback" else 0,
            })
            if record.queue_wait_s is not None:
                values[mc.QUEUE_WAIT] = record.queue_wait_s * 1000
            if record.ttft_s is not None:
                values[mc.TIME_TO_FIRST_TOKEN] = record.ttft_s * 1000
            if record.tpot_s is not None:
                values[mc.TIME_PER_OUTPUT_TOKEN] = record.tpot_s * 1000
        elif record.outcome == "fallback":
            values[mc.FALLBACKS] = 1
        self.emit(values, also=first_response, **fields)

    def _first_response(self, record: RequestRecord, latency_s: float) -> list[mc.MetricGroup]:
        """``FirstResponseLatency`` of ``record`` on its ``Mode``, as an extra metric group of
        the request's line (none for a request that does not count)."""
        seconds = record.first_response_s(latency_s)
        if seconds is None:
            return []
        return [({mc.FIRST_RESPONSE_LATENCY: seconds * 1000},
                 {**self.dimensions, "Mode": record.response_mode})]

    def gauges(self, *, kv_cache_usage: float, running: int, waiting: int,
               preemptions: int, breaker_value: int, **properties: Any) -> None:
        """The periodic gauge line (kv_cache_usage is a 0-1 share; published as 0-100)."""
        self.emit({
            mc.KV_CACHE_USAGE: kv_cache_usage * 100,
            mc.RUNNING_REQUESTS: running,
            mc.WAITING_REQUESTS: waiting,
            mc.PREEMPTIONS: preemptions,
            mc.BREAKER_STATE: breaker_value,
        }, event="gauges", **properties)
