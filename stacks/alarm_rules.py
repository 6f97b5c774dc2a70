"""The alarm rules of each endpoint kind: what pages, what warns, and why.

Seed 002's lesson is to watch GPU memory, queue depth and time to first token together; seed
000's, that every circuit-breaker trip emits a metric someone sees. The thresholds come from
settings (``llm.alarms``, ``intent.alarms``); the rules' shape lives here.

What pages for the LLM is what its users feel: time to first token and the stream's pace (time
per output token), both p99 against the SLOs the capacity model sizes the fleet for. SageMaker's
``ModelLatency`` is a whole non-streamed generation of up to ``max_tokens`` tokens — seconds by
design under batching — so it stays on the dashboard and pages only for the intent classifier,
whose answer is one forward pass.
"""

from __future__ import annotations

from aws_cdk import aws_cloudwatch as cloudwatch

import metrics_contract as mc
from request_buckets import REJECTION_BUCKETS
from stacks.alarms import AlarmRule, MathInput
from stacks.settings import EndpointAlarmSettings

GTE = cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD
GT = cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD
LT = cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD
NOT_BREACHING = cloudwatch.TreatMissingData.NOT_BREACHING
BREACHING = cloudwatch.TreatMissingData.BREACHING
MISSING = cloudwatch.TreatMissingData.MISSING

ROLLBACK_RULES: tuple[str, ...] = (
    "invocation-5xx", "oom-circuit-trips", "time-to-first-token-p99", "time-per-output-token-p99")
"""Alarms that roll a blue/green deployment of the LLM endpoint back."""

INTENT_ROLLBACK_RULES: tuple[str, ...] = ("invocation-5xx", "model-latency-p99")

LOCK_OUT_MINUTES = 3
"""Consecutive minutes, each with a refusal on a nearly idle engine, that page as a lock-out. The
prefill valve heals a wrong rate within 15 s (docs/design-decisions.md#admission-lock-out), so
a healing episode touches at most two minutes; a third in a row means it is not healing."""

INSTANCE_COUNT_EXPRESSION = "IF(perinstance > 0, invocations / perinstance, 0)"
"""SageMaker publishes no instance count for a variant; Invocations ÷ InvocationsPerInstance
(both per-minute sums) is the number of InService instances whenever the variant has traffic."""

MAX_IN_FORCE_ID = "maxinforce"
"""Expression id of the published maximum in force (``MaxCapacityInForce``)."""
MIN_IN_FORCE_ID = "mininforce"
"""Expression id of the published minimum in force (``MinCapacityInForce``)."""


def max_in_force_expression(fallback_max_capacity: int) -> str:
    """The maximum in force, minute by minute, with its gaps filled deliberately.

    The scaling-limits Lambda publishes ``MaxCapacityInForce`` once a minute. A minute it missed
    (EventBridge jitter) repeats the last published value (``FILL(..., REPEAT)``); a window with
    no value at all (the publisher is down) falls back to the registered maximum, so the alarm
    degrades to "pinned at the absolute maximum" — it never pages falsely — while
    ``capacity-limits-missing`` says the night-time and release limits are unknown.
    """
    return f"FILL(FILL({MAX_IN_FORCE_ID}, REPEAT), {fallback_max_capacity})"


def capacity_pinned_rule(*, max_capacity: int, minutes: int) -> AlarmRule:
    """Instances at the maximum *in force* for ``minutes``: autoscaling has nothing left to give.

    The maximum moves during the day: 7 between 01:00 and 08:00 Tokyo in production, 30 by day,
    whatever a release pre-scale or a dated event sets. Application Auto Scaling publishes no
    metric of it, so the scaling-limits Lambda publishes what DescribeScalableTargets reports
    (``MaxCapacityInForce``) and the alarm compares the instance count with it; ``max_capacity``
    (the registered maximum) is only the fallback while that metric is missing.
    """
    return AlarmRule(
        name="capacity-pinned-at-max",
        expression=f"({INSTANCE_COUNT_EXPRESSION}) - {max_in_force_expression(max_capacity)}",
        inputs={
            "invocations": MathInput(mc.SM_INVOCATIONS, "Sum"),
            "perinstance": MathInput(mc.SM_INVOCATIONS_PER_INSTANCE, "Sum"),
            MAX_IN_FORCE_ID: MathInput(mc.MAX_CAPACITY_IN_FORCE, "Maximum"),
        },
        # instances − max in force ≥ −0.5: at the maximum (the count is an average over the
        # minute, so a fleet of N that briefly had N − 1 does not count as N).
        threshold=-0.5,
        comparison=GTE,
        period_s=60,
        evaluation_periods=minutes,
        datapoints_to_alarm=minutes,
        missing_data=NOT_BREACHING,  # no traffic: nothing is pinned
        severity="page",
        meaning=f"The variant has run at the maximum instance count in force (the daily "
        f"schedule's, a release pre-scale's or the registered {max_capacity}) for {minutes} "
        "minutes: autoscaling cannot add capacity and requests will start to be shed.",
        runbook="scaling-pinned-at-max.md",
    )


def capacity_limits_missing_rule() -> AlarmRule:
    """The published maximum in force is missing: the pinned alarm only knows the registered
    maximum (it would miss a night-time or release-window surge).

    The failure is the metric's absence, so the alarm treats missing data as ``missing`` and
    notifies on INSUFFICIENT_DATA: "if all data points in the alarm evaluation range are
    missing, the alarm transitions to INSUFFICIENT_DATA" (CloudWatch User Guide, "Configuring
    how CloudWatch alarms treat missing data"). ``breaching`` would page at the first deploy: a
    new alarm is evaluated at once ("When this operation creates an alarm, the alarm state is
    immediately set to INSUFFICIENT_DATA. The alarm is then evaluated", PutMetricAlarm), before
    the endpoints are InService and their scalable targets exist, and three missing periods
    read as breaching are ALARM. An alarm created in INSUFFICIENT_DATA that stays there changes
    no state, and "the actions happen only on state transitions" (CloudWatch User Guide,
    "Alarm actions"); it is created after the scalable targets (serving_stack.py).
    """
    return AlarmRule(
        name="capacity-limits-missing",
        metric=mc.MAX_CAPACITY_IN_FORCE,
        statistic="SampleCount",
        threshold=1,
        comparison=LT,
        period_s=300,
        evaluation_periods=3,
        datapoints_to_alarm=3,
        missing_data=MISSING,  # its absence is INSUFFICIENT_DATA, which notifies
        severity="warn",
        meaning="The scaling-limits Lambda has published no MaxCapacityInForce for this variant "
        "for 15 minutes (INSUFFICIENT_DATA: failing, throttled, or the scalable target is "
        "deregistered): capacity-pinned-at-max falls back to the registered maximum and misses "
        "surges pinned at a lower scheduled maximum (nights, release windows).",
        runbook="scaling-pinned-at-max.md",
        notify_insufficient_data=True,
    )


def common_rules(settings: EndpointAlarmSettings, *, max_capacity: int) -> list[AlarmRule]:
    """Rules every SageMaker endpoint gets: 5xx, capacity pinned at the maximum in force, and the
    warning that the maximum in force is unknown."""
    return [
        AlarmRule(
            name="invocation-5xx",
            metric=mc.SM_INVOCATION_5XX,
            statistic="Sum",
            threshold=settings.invocation_5xx_per_min,
            comparison=GTE,
            period_s=60,
            evaluation_periods=3,
            datapoints_to_alarm=2,
            missing_data=NOT_BREACHING,  # no traffic, no errors
            severity="page",
            meaning="The container answered requests with 5xx in 2 of the last 3 minutes. The "
            "gateway never answers bad input with 5xx: this is a crash, a dead engine past its "
            "grace, or an instance SageMaker is replacing.",
            runbook="engine-restarts.md",
        ),
        capacity_pinned_rule(max_capacity=max_capacity, minutes=settings.pinned_at_max_minutes),
        capacity_limits_missing_rule(),
    ]


def model_latency_rule(settings: EndpointAlarmSettings) -> AlarmRule:
    """ModelLatency p99 over the SLA: pages for the intent classifier (one forward pass)."""
    return AlarmRule(
        name="model-latency-p99",
        metric=mc.SM_MODEL_LATENCY,
        statistic="p99",
        threshold=settings.latency_p99_sla_ms * 1000,  # SageMaker reports microseconds
        comparison=GT,
        period_s=60,
        evaluation_periods=5,
        datapoints_to_alarm=3,
        missing_data=NOT_BREACHING,
        severity="page",
        meaning=f"ModelLatency p99 was above the {settings.latency_p99_sla_ms} ms SLA in 3 "
        "of the last 5 minutes.",
        runbook="scaling-pinned-at-max.md",
    )


def latency_slo_rules(settings: EndpointAlarmSettings) -> list[AlarmRule]:
    """The LLM's paging and rollback latency alarms: first token and stream pace, p99."""
    return [
        AlarmRule(
            name="time-to-first-token-p99",
            metric=mc.TIME_TO_FIRST_TOKEN,
            statistic="p99",
            threshold=settings.time_to_first_token_p99_ms,
            comparison=GT,
            period_s=60,
            evaluation_periods=5,
            datapoints_to_alarm=3,
            missing_data=NOT_BREACHING,  # no requests, nothing to feel
            severity="page",
            meaning=f"Time to first token p99 was above {settings.time_to_first_token_p99_ms:g} "
            "ms in 3 of the last 5 minutes: users wait before the answer starts (the SLO the "
            "capacity model sizes each instance for; llm.alarms.time_to_first_token_p99_ms "
            "says why that number).",
            runbook="latency-slo.md",
        ),
        AlarmRule(
            name="time-per-output-token-p99",
            metric=mc.TIME_PER_OUTPUT_TOKEN,
            statistic="p99",
            threshold=settings.time_per_output_token_p99_ms,
            comparison=GT,
            period_s=60,
            evaluation_periods=5,
            datapoints_to_alarm=3,
            missing_data=NOT_BREACHING,
            severity="page",
            meaning=f"Time per output token p99 was above "
            f"{settings.time_per_output_token_p99_ms:g} ms in 3 of the last 5 minutes: the "
            "stream is slower than users read (too many requests batched per GPU, or a slow "
            "engine).",
            runbook="latency-slo.md",
        ),
    ]


FIRST_RESPONSE_PERIOD_S = 300
"""The p99.9 alarm's period. CloudWatch's p99.9 over fewer than 1,000 values is the slowest
request or close to it; five minutes gather about 2,400 first responses across the prod fleet at
night (480 invocations/min expected off-peak, docs/capacity.md), so the figure is a percentile
and not one slow request, where one minute would not be."""


def first_response_rule(settings: EndpointAlarmSettings) -> AlarmRule:
    """Seed 001's "P99.9 first-response latency < 5 s including worst-case warmup", on streamed
    requests: arrival to the first token (or the 429/503 that refused it), the gateway's
    ``FirstResponseLatency`` with ``Mode`` streamed.

    Non-streamed calls are on the dashboard, not here: their first response is the whole answer
    (9 s for the mix's mean answer at the planned batch), so a 5 s bound on them measures the
    caller's ``max_tokens``, not the service. It warns rather than pages: the p99 of the first
    token pages for what most users feel, and the tail's usual causes (an engine death and its
    rebuild, a scale-out) page or warn on their own alarms; 2 of 3 five-minute periods let one
    slow burst pass and hold a tail that lasts
    (docs/design-decisions.md#p999-first-response)."""
    return AlarmRule(
        name="first-response-p99.9",
        metric=mc.FIRST_RESPONSE_LATENCY,
        dimensions={"Mode": "streamed"},
        statistic="p99.9",
        threshold=settings.first_response_p999_ms,
        comparison=GT,
        period_s=FIRST_RESPONSE_PERIOD_S,
        evaluation_periods=3,
        datapoints_to_alarm=2,
        missing_data=NOT_BREACHING,  # no requests, nobody waited
        severity="warn",
        meaning=f"The p99.9 of the first response to streamed requests (arrival to the first "
        f"token, or to the 429/503 that refused it) was above "
        f"{settings.first_response_p999_ms:g} ms in 2 of the last 3 five-minute periods: more "
        "than 1 request in 1,000 waits longer than Seed 001 allows (cold or rebuilding engines, "
        "admission waits, long prefills).",
        runbook="first-response-p999.md",
    )


REJECTION_INPUT_IDS: dict[str, str] = {name: f"shed{name.lower()}"
                                       for name in REJECTION_BUCKETS}
"""Expression ids of ``AdmissionRejections`` per bucket (metric math ids start lower-case)."""


def release_window_rejections_rule(settings: EndpointAlarmSettings, *,
                                   daily_minimum: int) -> AlarmRule:
    """The gateway's 429s while a release pre-scale is in force (zero 429s in release
    windows, docs/design-decisions.md#release-window-429s), as a share of all invocations.

    A release window is when the minimum in force (``MinCapacityInForce``, published by the
    scaling-limits Lambda) is above every daily floor: only a release pre-scale (or an operator)
    raises it there. A pre-scale no higher than the daily floor is not told apart — its window
    needs no more capacity than the day, and ``capacity-pinned-at-max`` still watches it.
    """
    shed = " + ".join(f"FILL({key}, 0)" for key in REJECTION_INPUT_IDS.values())
    return AlarmRule(
        name="release-window-rejections",
        expression=(f"IF(FILL({MIN_IN_FORCE_ID}, 0) > {daily_minimum}, "
                    f"100 * ({shed}) / invocations, 0)"),
        inputs={
            **{key: MathInput(mc.ADMISSION_REJECTIONS, "Sum", {"Bucket": bucket})
               for bucket, key in REJECTION_INPUT_IDS.items()},
            "invocations": MathInput(mc.SM_INVOCATIONS, "Sum"),
            MIN_IN_FORCE_ID: MathInput(mc.MIN_CAPACITY_IN_FORCE, "Maximum"),
        },
        threshold=settings.release_window_rejection_percent,
        comparison=GT,
        period_s=300,
        evaluation_periods=1,
        datapoints_to_alarm=1,
        missing_data=NOT_BREACHING,  # no invocations: nothing was shed
        severity="ticket",
        meaning=f"During a release window (minimum in force above the daily floors' "
        f"{daily_minimum}) the gateway shed more than "
        f"{settings.release_window_rejection_percent:g} % of requests with 429 in 5 minutes: "
        "the pre-scale was too small for the release (the requirement: none).",
        runbook="release-window-rejections.md",
    )


def llm_alarm_rules(
    settings: EndpointAlarmSettings, *, gpu_count: int, max_capacity: int, daily_minimum: int
) -> list[AlarmRule]:
    """Every alarm of the vLLM endpoint."""
    return [
        *common_rules(settings, max_capacity=max_capacity),
        *latency_slo_rules(settings),
        first_response_rule(settings),
        release_window_rejections_rule(settings, daily_minimum=daily_minimum),
        *engine_health_rules(settings),
        *gpu_memory_rules(settings, gpu_count=gpu_count),
    ]


def engine_health_rules(settings: EndpointAlarmSettings) -> list[AlarmRule]:
    """The LLM engine's deaths and what they cost: breaker trips, restarts, fallback answers."""
    return [
        AlarmRule(
            name="oom-circuit-trips",
            metric=mc.OOM_CIRCUIT_TRIPS,
            statistic="Sum",
            threshold=1,
            comparison=GTE,
            period_s=60,
            evaluation_periods=1,
            datapoints_to_alarm=1,
            missing_data=NOT_BREACHING,  # emitted only when a trip happens
            severity="page",
            meaning="The engine died of GPU OOM (or another engine fault) and the circuit "
            "breaker opened: requests got the fallback answer while the engine was rebuilt.",
            runbook="breaker-open.md",
        ),
        AlarmRule(
            name="admission-lock-out",
            metric=mc.REFUSALS_WHILE_IDLE,
            statistic="Sum",
            threshold=1,
            comparison=GTE,
            period_s=60,
            evaluation_periods=LOCK_OUT_MINUTES,
            datapoints_to_alarm=LOCK_OUT_MINUTES,
            missing_data=NOT_BREACHING,  # emitted only when such a refusal happens
            severity="page",
            meaning=f"The gateway refused requests with 429 ttft_slo while its engine was nearly "
            f"idle in each of {LOCK_OUT_MINUTES} consecutive minutes: a healthy instance "
            "turning users away because its prefill valve's measured rate is wrong and not "
            "healing (a healing episode lasts seconds).",
            runbook="admission-lock-out.md",
        ),
        AlarmRule(
            name="engine-restarts",
            metric=mc.ENGINE_RESTARTS,
            statistic="Sum",
            threshold=settings.engine_restarts_per_hour,
            comparison=GTE,
            period_s=3600,
            evaluation_periods=1,
            datapoints_to_alarm=1,
            missing_data=NOT_BREACHING,
            severity="warn",
            meaning=f"The gateway rebuilt a dead engine {settings.engine_restarts_per_hour} or "
            "more times in an hour; one more death in the crash-loop window turns /ping red and "
            "SageMaker replaces the instance.",
            runbook="engine-restarts.md",
        ),
        AlarmRule(
            name="fallback-rate",
            expression="IF(requests > 0, 100 * fallbacks / requests, 0)",
            inputs={
                "fallbacks": MathInput(mc.FALLBACKS, "Sum"),
                "requests": MathInput(mc.REQUESTS, "Sum"),
            },
            threshold=settings.fallback_rate_percent,
            comparison=GTE,
            period_s=300,
            evaluation_periods=2,
            datapoints_to_alarm=2,
            missing_data=NOT_BREACHING,
            severity="warn",
            meaning=f"More than {settings.fallback_rate_percent} % of requests got the "
            "controlled fallback for 10 minutes: the breaker keeps opening or XL requests are "
            "refused while it is open.",
            runbook="breaker-open.md",
        ),
    ]


def gpu_memory_rules(settings: EndpointAlarmSettings, *, gpu_count: int) -> list[AlarmRule]:
    """GPU memory, the KV cache and the admission queue they back up into."""
    return [
        AlarmRule(
            name="gpu-memory-utilization",
            metric=mc.SM_GPU_MEMORY_UTILIZATION,
            statistic="Maximum",
            threshold=settings.gpu_memory_percent * gpu_count,  # 0-100 per GPU, summed
            comparison=GTE,
            period_s=60,
            evaluation_periods=5,
            datapoints_to_alarm=5,
            missing_data=MISSING,
            severity="warn",
            meaning=f"GPU memory stayed at or above {settings.gpu_memory_percent} % (of "
            f"{gpu_count} GPU(s)) for 5 minutes. vLLM preallocates its budget, so this means the "
            "headroom outside gpu_memory_utilization is being eaten: the next allocation may OOM.",
            runbook="oom-diagnosis.md",
        ),
        AlarmRule(
            name="kv-cache-usage-high",
            metric=mc.KV_CACHE_USAGE,
            statistic="Average",
            threshold=settings.kv_cache_usage_percent,
            comparison=GTE,
            period_s=60,
            evaluation_periods=10,
            datapoints_to_alarm=8,
            missing_data=MISSING,
            severity="warn",
            meaning=f"KV-cache usage averaged {settings.kv_cache_usage_percent} % or more in 8 of "
            "the last 10 minutes: admission is about to shed and the engine to preempt.",
            runbook="oom-diagnosis.md",
        ),
        AlarmRule(
            name="queue-wait-p99",
            metric=mc.QUEUE_WAIT,
            statistic="p99",
            threshold=settings.queue_wait_p99_ms,
            comparison=GT,
            period_s=60,
            evaluation_periods=5,
            datapoints_to_alarm=3,
            missing_data=NOT_BREACHING,
            severity="warn",
            meaning=f"Requests waited more than {settings.queue_wait_p99_ms} ms (p99) for "
            "admission in 3 of the last 5 minutes (the requirement: < 150 ms at 100 RPS).",
            runbook="oom-diagnosis.md",
        ),
    ]


def intent_alarm_rules(settings: EndpointAlarmSettings, *, max_capacity: int) -> list[AlarmRule]:
    """Every alarm of the intent classifier endpoint."""
    return [
        *common_rules(settings, max_capacity=max_capacity),
        model_latency_rule(settings),
        AlarmRule(
            name="intent-latency-p99",
            metric=mc.INTENT_LATENCY,
            statistic="p99",
            threshold=settings.latency_p99_sla_ms,
            comparison=GT,
            period_s=60,
            evaluation_periods=5,
            datapoints_to_alarm=3,
            missing_data=NOT_BREACHING,
            severity="warn",
            meaning=f"Classifier inference p99 inside the container exceeded "
            f"{settings.latency_p99_sla_ms} ms in 3 of the last 5 minutes.",
            runbook="scaling-pinned-at-max.md",
        ),
    ]


def calendar_lambda_rules() -> list[AlarmRule]:
    """The release-calendar Lambda: failed runs (as they happen, and kept in its queue until
    replayed), failed runs that could not be kept, and skipped calendar entries."""
    return [
        AlarmRule(
            name="errors",
            metric=mc.LAMBDA_ERRORS,
            statistic="Sum",
            threshold=1,
            comparison=GTE,
            period_s=300,
            evaluation_periods=1,
            datapoints_to_alarm=1,
            missing_data=NOT_BREACHING,  # it runs once a day and after deployments
            severity="warn",
            meaning="The release-calendar reconciler failed: the calendar could not be read or "
            "parsed, its configuration is wrong, or scheduled-action calls failed. Dated "
            "releases may not be pre-scaled.",
            runbook="release-calendar-lambda.md",
        ),
        AlarmRule(
            name="failed-runs-queued",
            metric=mc.SQS_MESSAGES_VISIBLE,
            statistic="Maximum",
            threshold=1,
            comparison=GTE,
            period_s=300,
            evaluation_periods=1,
            datapoints_to_alarm=1,
            # SQS stops publishing for an empty queue left idle: an empty queue is fine.
            missing_data=NOT_BREACHING,
            severity="warn",
            meaning="A release-calendar run failed after Lambda's retries (or EventBridge could "
            "not deliver one) and is kept in the failed-runs queue. The alarm stays in ALARM "
            "until the message is replayed and deleted (or expires after 14 days).",
            runbook="release-calendar-lambda.md",
        ),
        AlarmRule(
            name="destination-delivery-failures",
            metric=mc.LAMBDA_DESTINATION_DELIVERY_FAILURES,
            statistic="Sum",
            threshold=1,
            comparison=GTE,
            period_s=300,
            evaluation_periods=1,
            datapoints_to_alarm=1,
            missing_data=NOT_BREACHING,
            severity="warn",
            meaning="Lambda could not put a failed run's record on the failed-runs queue "
            "(queue policy, KMS key policy, or the queue is gone): that failure is only in the "
            "logs.",
            runbook="release-calendar-lambda.md",
        ),
        AlarmRule(
            name="entries-skipped",
            metric=mc.CALENDAR_ENTRIES_SKIPPED,
            statistic="Maximum",
            threshold=1,
            comparison=GTE,
            period_s=3600,
            evaluation_periods=1,
            datapoints_to_alarm=1,
            missing_data=NOT_BREACHING,
            severity="warn",
            meaning="The reconciler skipped invalid calendar entries (their existing actions "
            "were left as they were; the other entries applied).",
            runbook="release-calendar-lambda.md",
        ),
    ]
