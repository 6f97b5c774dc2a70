"""Settings both endpoints share: their alarm thresholds and SageMaker's health-check timeouts."""

from __future__ import annotations

from pydantic import Field

from stacks.settings.base import StrictModel


class EndpointAlarmSettings(StrictModel):
    """Alarm thresholds of one endpoint (stacks/alarm_rules.py says what each alarm means)."""

    latency_p99_sla_ms: float = Field(
        2000, gt=0,
        description="ModelLatency p99 SLA of the intent endpoint (seed: < 18 ms on Inferentia; "
        "2 s default). The LLM pages on time to first token and time per output token instead: "
        "its ModelLatency is a whole generation.",
    )
    time_to_first_token_p99_ms: float = Field(
        2000, gt=0, le=60000,
        description="LLM: first token p99 within 2 s: a first answer is promised within a 3 s SLA "
        "(docs/design-decisions.md#three-second-sla), and about a second goes to the "
        "orchestrator, the intent call and the network. Pages and rolls deployments back; the "
        "capacity model sizes for it.",
    )
    time_per_output_token_p99_ms: float = Field(
        100, gt=0, le=10000,
        description="LLM: one streamed token every 100 ms at p99 = 10 tokens/s, twice a reader's "
        "pace (238 words/min ≈ 5 tokens/s, Brysbaert 2019, J. Memory and Language 109). Pages, "
        "rolls back, and sizes the batch the capacity model allows.",
    )
    first_response_p999_ms: float = Field(
        5000, gt=0, le=60000,
        description="LLM: Seed 001's \"P99.9 first-response latency < 5 s including worst-case "
        "warmup\": arrival to the first token of a streamed answer (or its refusal) at p99.9 "
        "over 5 minutes. Warns (docs/design-decisions.md#p999-first-response).",
    )
    release_window_rejection_percent: float = Field(
        0.1, ge=0, le=100,
        description="LLM: share of requests the gateway may shed (429) while a release "
        "pre-scale is in force before a ticket is raised (zero 429s in release "
        "windows, docs/design-decisions.md#release-window-429s; 0.1 % ignores a stray retry).",
    )
    invocation_5xx_per_min: float = Field(1, gt=0)
    engine_restarts_per_hour: int = Field(2, ge=1)
    fallback_rate_percent: float = Field(5, gt=0, le=100)
    gpu_memory_percent: float = Field(98, gt=0, le=100, description="Per GPU.")
    kv_cache_usage_percent: float = Field(90, gt=0, le=100)
    queue_wait_p99_ms: float = Field(150, gt=0, description="Seed 001: < 150 ms at 100 RPS.")
    pinned_at_max_minutes: int = Field(15, ge=1, le=60)


class HealthCheckSettings(StrictModel):
    """How long SageMaker waits for a new instance: weight download, then warm-up."""

    model_data_download_timeout_s: int = Field(1200, ge=60, le=3600)
    container_startup_health_check_timeout_s: int = Field(
        1200, ge=60, le=3600,
        description="Until /ping answers 200: engine start, CUDA-graph capture and warm-up.",
    )
