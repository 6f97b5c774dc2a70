"""One CloudWatch dashboard per environment: what the on-call looks at when an alarm pages.

Seed 002's lesson is to read GPU memory, queue depth and time to first token *together*, so each
endpoint gets one section with, side by side: GPU memory and utilization, KV-cache usage,
running/waiting requests, TTFT, time per output token and latency percentiles, OOM trips and
fallbacks, the circuit breaker, admission rejections per length bucket, instances against the
capacity schedule, invocations per instance against the scaling target, an estimated cost per
hour and the status of the endpoint's alarms. The intent classifier's section shows its own
latency and predictions per intent instead of the LLM-only widgets. An optional row covers the
release-calendar Lambda.

Every metric comes from :mod:`metrics_contract` through :func:`stacks.alarms.contract_metric`;
:func:`dashboard_metric` refuses a spec that is not in the contract. Every number drawn as a line
(capacity limits, daily floors, the scaling targets, alarm thresholds, the instance price) comes
from settings, the capacity model's fleet plan, the alarm rules or the ``gpu_budget`` catalog,
never typed here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct

import metrics_contract as mc
from capacity_model import FleetPlan, FloorPlan
from gpu_budget import InstanceType, instance_type
from intents import INTENT_LABELS
from request_buckets import bucket_bounds
from stacks.alarm_rules import FIRST_RESPONSE_PERIOD_S, INSTANCE_COUNT_EXPRESSION
from stacks.alarms import RUNBOOK_BASE_URL, AlarmRule, AlarmSet, EndpointAlarms, contract_metric
from stacks.settings import ScalingSettings

EndpointKind = Literal["llm", "intent"]
ENDPOINT_KINDS: tuple[str, ...] = ("llm", "intent")

PERIOD = cdk.Duration.minutes(1)
"""Period of every endpoint widget (the console may widen it for long ranges; see below)."""
TAIL_PERIOD = cdk.Duration.seconds(FIRST_RESPONSE_PERIOD_S)
"""Period of the p99.9 lines: the alarm's (a p99.9 over one minute at night is one request)."""
CALENDAR_PERIOD = cdk.Duration.hours(1)
"""The calendar Lambda runs daily and after deployments: hourly sums keep its points visible."""

INVOCATIONS_ID = "invocations"
PER_INSTANCE_ID = "perinstance"
for _expression_id in (INVOCATIONS_ID, PER_INSTANCE_ID):
    if _expression_id not in INSTANCE_COUNT_EXPRESSION:  # pragma: no cover - guards alarm_rules
        raise RuntimeError(
            f"INSTANCE_COUNT_EXPRESSION {INSTANCE_COUNT_EXPRESSION!r} no longer uses the id "
            f"{_expression_id!r}; update stacks/dashboard.py"
        )

_bucket_values = mc.ADMISSION_REJECTIONS.values_of("Bucket")
if _bucket_values is None:  # pragma: no cover - guards metrics_contract
    raise RuntimeError("metrics_contract: AdmissionRejections no longer declares its Bucket values")
BUCKET_NAMES: tuple[str, ...] = _bucket_values
"""Values of the AdmissionRejections ``Bucket`` dimension, as the contract declares them (the
request buckets of :mod:`request_buckets`, and ``Unsized`` for a refusal before parsing)."""

DASHBOARD_NAME = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
"""What CloudWatch accepts as a dashboard name."""

GRID_WIDTH = 24
WIDGET_WIDTH = 8
WIDGET_HEIGHT = 6

# Annotation colours: alarm thresholds red, hard limits grey, schedule floors orange, targets green.
ALARM_COLOR = "#d62728"
LIMIT_COLOR = "#7f7f7f"
SCHEDULE_COLOR = "#ff7f0e"
TARGET_COLOR = "#2ca02c"

PERCENTILES: tuple[str, ...] = ("p50", "p90", "p99")


@dataclass(frozen=True)
class DashboardEndpoint:
    """One SageMaker endpoint variant as the dashboard shows it."""

    title: str
    """Section heading and widget-title prefix, e.g. "LLM (vLLM on ml.g5.xlarge)"."""
    endpoint_name: str
    variant_name: str
    kind: EndpointKind
    instance_type: str
    """A ``gpu_budget`` catalog name: it gives the price per hour and the GPU count."""
    scaling: ScalingSettings
    """Min/max capacity and which policies run."""
    fleet: FleetPlan
    """The capacity model's scaling targets and daily ranges, drawn on the capacity widgets."""
    alarms: EndpointAlarms
    """The endpoint's alarms: thresholds drawn as annotations, states in the alarm widget."""
    max_model_len: int | None = None
    """The LLM's context window (required for ``llm``): the request buckets' token ranges."""

    def __post_init__(self) -> None:
        if self.kind not in ENDPOINT_KINDS:
            raise ValueError(
                f"dashboard endpoint {self.title!r}: kind {self.kind!r} is not accepted; "
                f"accepted: {', '.join(ENDPOINT_KINDS)}"
            )
        if not self.title.strip():
            raise ValueError(f"dashboard endpoint {self.endpoint_name!r}: title is empty")
        catalog = instance_type(self.instance_type)  # unknown names list the catalog
        if self.kind == "llm" and catalog.gpu_count < 1:
            raise ValueError(
                f"dashboard endpoint {self.title!r}: instance_type {self.instance_type!r} has no "
                "GPU; an llm endpoint runs vLLM on a GPU instance of the catalog"
            )
        if self.kind == "llm":
            if self.max_model_len is None:
                raise ValueError(f"dashboard endpoint {self.title!r}: an llm endpoint needs "
                                 "max_model_len (its request buckets are fractions of it)")
            bucket_bounds(self.max_model_len)  # ValueError names a window it cannot split

    @property
    def instance(self) -> InstanceType:
        """The catalog entry of ``instance_type``."""
        return instance_type(self.instance_type)

    @property
    def dimensions(self) -> dict[str, str]:
        """EndpointName and VariantName, the dimensions every per-endpoint metric carries."""
        return {"EndpointName": self.endpoint_name, "VariantName": self.variant_name}


def dashboard_metric(
    spec: mc.MetricSpec,
    dimensions: Mapping[str, str],
    *,
    statistic: str,
    label: str,
    period: cdk.Duration = PERIOD,
) -> cloudwatch.Metric:
    """A widget metric for a contract entry (:func:`contract_metric` at the dashboard's period);
    ValueError for a spec or dimensions the contract does not hold."""
    return contract_metric(spec, dimensions, statistic=statistic, period=period, label=label)


def _usd(amount: float) -> str:
    return f"${amount:,.3f}"


def price_source(instance: InstanceType) -> str:
    """Where the hourly price comes from, for labels: region, basis, date, 'approximate'."""
    return (
        f"{instance.name} on-demand {instance.price_region}, {instance.price_basis} price, "
        f"gpu_budget catalog compiled {instance.prices_compiled_on}, approximate"
    )


def _annotations(
    entries: Sequence[tuple[float, str, str]],
) -> list[cloudwatch.HorizontalAnnotation]:
    """Horizontal lines; entries with the same value share one line with joined labels."""
    merged: dict[float, tuple[list[str], str]] = {}
    for value, label, color in entries:
        labels = merged.setdefault(float(value), ([], color))[0]  # the first colour wins
        if label not in labels:
            labels.append(label)
    return [
        cloudwatch.HorizontalAnnotation(value=value, label=" = ".join(labels), color=color)
        for value, (labels, color) in sorted(merged.items())
    ]


def _rule_watching(alarms: AlarmSet, spec: mc.MetricSpec) -> AlarmRule | None:
    """The first alarm rule that watches ``spec`` directly (its threshold is drawn)."""
    for rule in alarms.rules.values():
        if rule.metric == spec:
            return rule
    return None


def _threshold_line(
    alarms: AlarmSet, spec: mc.MetricSpec, *, unit: str, scale: float = 1.0
) -> list[tuple[float, str, str]]:
    rule = _rule_watching(alarms, spec)
    if rule is None:
        return []
    return [(rule.threshold, f"alarm {rule.name}: {rule.threshold / scale:g} {unit}".rstrip(),
             ALARM_COLOR)]


def _floor_label(name: str, floor: FloorPlan, bound: str, time_zone: str) -> str:
    return f"{name} {bound} (from {floor.start:%H:%M} {time_zone})"


def _graph(
    title: str,
    *,
    left: Sequence[cloudwatch.IMetric],
    left_axis: str,
    right: Sequence[cloudwatch.IMetric] = (),
    right_axis: str | None = None,
    annotations: Sequence[tuple[float, str, str]] = (),
    left_min: float | None = 0,
    left_max: float | None = None,
    stacked: bool = False,
    width: int = WIDGET_WIDTH,
) -> cloudwatch.GraphWidget:
    return cloudwatch.GraphWidget(
        title=title,
        left=list(left),
        right=list(right),
        left_y_axis=cloudwatch.YAxisProps(label=left_axis, min=left_min, max=left_max,
                                          show_units=False),
        right_y_axis=(cloudwatch.YAxisProps(label=right_axis, min=0, show_units=False)
                      if right else None),
        left_annotations=_annotations(annotations) or None,
        stacked=stacked,
        width=width,
        height=WIDGET_HEIGHT,
    )


class _EndpointSection:
    """The widgets of one endpoint, in reading order."""

    def __init__(self, endpoint: DashboardEndpoint) -> None:
        self.endpoint = endpoint
        self.dims = endpoint.dimensions
        self.instance = endpoint.instance
        self.alarms = endpoint.alarms

    def title(self, what: str) -> str:
        return f"{self.endpoint.title} · {what}"

    def metric(self, spec: mc.MetricSpec, statistic: str, label: str,
               **extra_dimensions: str) -> cloudwatch.Metric:
        return dashboard_metric(spec, {**self.dims, **extra_dimensions},
                                statistic=statistic, label=label)

    def percentiles(self, spec: mc.MetricSpec, name: str) -> list[cloudwatch.IMetric]:
        return [self.metric(spec, stat, f"{name} {stat}") for stat in PERCENTILES]

    def instance_count(self, label: str) -> cloudwatch.MathExpression:
        return self.instance_math(INSTANCE_COUNT_EXPRESSION, label)

    def instance_math(self, expression: str, label: str) -> cloudwatch.MathExpression:
        return cloudwatch.MathExpression(
            expression=expression,
            using_metrics={
                INVOCATIONS_ID: self.metric(mc.SM_INVOCATIONS, "Sum", "Invocations"),
                PER_INSTANCE_ID: self.metric(mc.SM_INVOCATIONS_PER_INSTANCE, "Sum",
                                             "InvocationsPerInstance"),
            },
            label=label,
            period=PERIOD,
        )

    # --- the section -----------------------------------------------------------------------------
    def widgets(self) -> list[cloudwatch.IWidget]:
        widgets: list[cloudwatch.IWidget] = [self.header()]
        widgets.extend(self.accelerator_widgets())
        if self.endpoint.kind == "llm":
            widgets.extend(self.llm_widgets())
        else:
            widgets.extend(self.intent_widgets())
        widgets.extend([
            self.model_latency(),
            self.invocations_and_errors(),
            self.instances_vs_schedule(),
            *self.load_vs_target(),
            self.cost_per_hour(),
            self.alarm_status(),
        ])
        return widgets

    def header(self) -> cloudwatch.TextWidget:
        endpoint, scaling, instance = self.endpoint, self.endpoint.scaling, self.instance
        fleet = endpoint.fleet
        accelerators = (f"{instance.accelerator_count} × {instance.accelerator_model}"
                        if instance.accelerator_count else "no accelerator")
        markdown = (
            f"## {endpoint.title}\n"
            f"Endpoint `{endpoint.endpoint_name}`, variant `{endpoint.variant_name}` · "
            f"{instance.name}: {accelerators} · ≈ {_usd(instance.on_demand_usd_per_hour)} per "
            f"instance-hour ({price_source(instance)}) · capacity {scaling.min_capacity}–"
            f"{scaling.max_capacity} instances; off-peak from {scaling.off_peak.start} "
            f"{fleet.off_peak.min_capacity}–{fleet.off_peak.max_capacity}, business hours "
            f"from {scaling.business_hours.start} {fleet.business_hours.min_capacity}–"
            f"{fleet.business_hours.max_capacity} ({scaling.time_zone}) · one instance "
            f"sustains ≈ {fleet.per_instance_invocations_per_min:g} invocations/min, "
            f"{fleet.headroom:.0%} headroom kept (capacity model) · "
            f"[runbooks]({RUNBOOK_BASE_URL}/README.md)"
        )
        return cloudwatch.TextWidget(markdown=markdown, width=GRID_WIDTH, height=2)

    def accelerator_widgets(self) -> list[cloudwatch.IWidget]:
        gpus = self.instance.gpu_count
        if gpus == 0:  # Inferentia / CPU: SageMaker publishes no GPU metrics for them
            return [_graph(
                self.title("CPU and host memory utilization (%)"),
                left=[self.metric(mc.SM_CPU_UTILIZATION, "Maximum",
                                  "CPUUtilization max (100 per vCPU)"),
                      self.metric(mc.SM_MEMORY_UTILIZATION, "Maximum", "MemoryUtilization max")],
                left_axis="% (CPU: 100 per vCPU)",
            )]
        full = (100.0 * gpus, f"100 % × {gpus} GPU(s): full", LIMIT_COLOR)
        axis = f"% (100 per GPU, {gpus} GPU(s))"
        return [
            _graph(
                self.title(f"GPU memory (%, 100 per GPU × {gpus})"),
                left=[self.metric(mc.SM_GPU_MEMORY_UTILIZATION, "Maximum",
                                  "GPUMemoryUtilization max"),
                      self.metric(mc.SM_GPU_MEMORY_UTILIZATION, "Average",
                                  "GPUMemoryUtilization avg")],
                left_axis=axis, left_max=100.0 * gpus,
                annotations=[full, *_threshold_line(self.alarms, mc.SM_GPU_MEMORY_UTILIZATION,
                                                    unit="%")],
            ),
            _graph(
                self.title(f"GPU utilization (%, 100 per GPU × {gpus})"),
                left=[self.metric(mc.SM_GPU_UTILIZATION, "Maximum", "GPUUtilization max"),
                      self.metric(mc.SM_GPU_UTILIZATION, "Average", "GPUUtilization avg")],
                left_axis=axis, left_max=100.0 * gpus, annotations=[full],
            ),
        ]

    def llm_widgets(self) -> list[cloudwatch.IWidget]:
        assert self.endpoint.max_model_len is not None  # checked in DashboardEndpoint
        bounds = bucket_bounds(self.endpoint.max_model_len)
        breaker_names = {"closed": "closed", "half_open": "half-open (probing)",
                         "open": "open (XL refused, context budget cut)"}
        breaker_legend = [
            (float(value), f"{value} = {breaker_names.get(state, state)}", LIMIT_COLOR)
            for state, value in sorted(mc.BREAKER_STATE_VALUES.items(), key=lambda i: i[1])
        ]
        return [
            _graph(
                self.title("KV-cache usage (%)"),
                left=[self.metric(mc.KV_CACHE_USAGE, "Maximum", "KVCacheUsage max"),
                      self.metric(mc.KV_CACHE_USAGE, "Average", "KVCacheUsage avg")],
                left_axis="% of KV blocks", left_max=100,
                annotations=[(100.0, "100 %: engine preempts", LIMIT_COLOR),
                             *_threshold_line(self.alarms, mc.KV_CACHE_USAGE, unit="%")],
            ),
            _graph(
                self.title("Running and waiting requests"),
                left=[self.metric(mc.RUNNING_REQUESTS, "Maximum", "RunningRequests max"),
                      self.metric(mc.WAITING_REQUESTS, "Maximum", "WaitingRequests max")],
                left_axis="requests",
                right=[self.metric(mc.PREEMPTIONS, "Sum", "Preemptions (sum)")],
                right_axis="preemptions",
            ),
            _graph(
                self.title("Time to first token (ms)"),
                left=self.percentiles(mc.TIME_TO_FIRST_TOKEN, "TimeToFirstToken"),
                left_axis="milliseconds (ms)",
                annotations=_threshold_line(self.alarms, mc.TIME_TO_FIRST_TOKEN, unit="ms"),
            ),
            self.first_response(),
            self.prefix_cache(),
            _graph(
                self.title("Time per output token (ms)"),
                left=self.percentiles(mc.TIME_PER_OUTPUT_TOKEN, "TimePerOutputToken"),
                left_axis="milliseconds (ms)",
                annotations=_threshold_line(self.alarms, mc.TIME_PER_OUTPUT_TOKEN, unit="ms"),
            ),
            _graph(
                self.title("Gateway request latency (ms)"),
                left=self.percentiles(mc.REQUEST_LATENCY, "RequestLatency"),
                left_axis="milliseconds (ms)",
            ),
            _graph(
                self.title("Admission queue wait (ms)"),
                left=self.percentiles(mc.QUEUE_WAIT, "QueueWait"),
                left_axis="milliseconds (ms)",
                annotations=_threshold_line(self.alarms, mc.QUEUE_WAIT, unit="ms"),
            ),
            _graph(
                self.title("OOM circuit trips, fallbacks, engine restarts"),
                left=[self.metric(mc.OOM_CIRCUIT_TRIPS, "Sum", "OOMCircuitTrips"),
                      self.metric(mc.ENGINE_RESTARTS, "Sum", "EngineRestarts")],
                left_axis="count per period",
                right=[self.metric(mc.FALLBACKS, "Sum", "Fallbacks"),
                       self.metric(mc.REQUESTS, "Sum", "Requests")],
                right_axis="requests per period",
            ),
            _graph(
                self.title("Circuit breaker state (0 closed, 1 half-open, 2 open)"),
                left=[self.metric(mc.BREAKER_STATE, "Maximum", "BreakerState max")],
                left_axis="state", left_max=max(mc.BREAKER_STATE_VALUES.values()),
                annotations=breaker_legend,
            ),
            _graph(
                self.title("Admission rejections by bucket (prompt + max output tokens)"),
                left=[self.metric(mc.ADMISSION_REJECTIONS, "Sum",
                                  f"AdmissionRejections {bounds.label(name)}", Bucket=name)
                      for name in BUCKET_NAMES],
                left_axis="requests shed per period", stacked=True,
            ),
        ]

    def first_response(self) -> cloudwatch.GraphWidget:
        """Seed 001's P99.9 first response beside the first-token p99, each with its alarm line:
        streamed requests (what the alarm reads) and non-streamed ones (whose first response is
        the whole answer: drawn, not alarmed), p99.9 at the alarm's period."""
        tails = [
            dashboard_metric(mc.FIRST_RESPONSE_LATENCY, {**self.dims, "Mode": mode},
                             statistic="p99.9", label=f"FirstResponseLatency p99.9 {mode}",
                             period=TAIL_PERIOD)
            for mode in mc.RESPONSE_MODES
        ]
        return _graph(
            self.title("First response p99.9 vs first token p99 (ms)"),
            left=[self.metric(mc.TIME_TO_FIRST_TOKEN, "p99", "TimeToFirstToken p99"), *tails],
            left_axis="milliseconds (ms)",
            annotations=[*_threshold_line(self.alarms, mc.TIME_TO_FIRST_TOKEN, unit="ms"),
                         *_threshold_line(self.alarms, mc.FIRST_RESPONSE_LATENCY, unit="ms")],
        )

    def prefix_cache(self) -> cloudwatch.GraphWidget:
        """Beside time to first token: how much of the prompts the prefix cache served (the
        stepped window and sessions keep it high; a drop shows up as slower first tokens), and
        requests that named a session their instance did not hold."""
        hit_rate = cloudwatch.MathExpression(
            expression="100 * cached / prompt",
            using_metrics={
                "cached": self.metric(mc.CACHED_PROMPT_TOKENS, "Sum", "CachedPromptTokens"),
                "prompt": self.metric(mc.PROMPT_TOKENS, "Sum", "PromptTokens"),
            },
            label="prompt tokens served from the prefix cache (%)", period=PERIOD)
        return _graph(
            self.title("Prefix cache hit rate (%) and sessions"),
            left=[hit_rate], left_axis="% of prompt tokens", left_max=100,
            right=[self.metric(mc.SESSION_MISSES, "Sum", "SessionMisses"),
                   self.metric(mc.SESSIONS_OPENED, "Sum", "SessionsOpened")],
            right_axis="requests per period",
        )

    def intent_widgets(self) -> list[cloudwatch.IWidget]:
        return [
            _graph(
                self.title("Intent classification latency (ms)"),
                left=self.percentiles(mc.INTENT_LATENCY, "IntentLatency"),
                left_axis="milliseconds (ms)",
                annotations=_threshold_line(self.alarms, mc.INTENT_LATENCY, unit="ms"),
            ),
            _graph(
                self.title("Intent predictions by intent"),
                left=[self.metric(mc.INTENT_PREDICTIONS, "Sum", label, Intent=label)
                      for label in INTENT_LABELS],
                left_axis="texts per period", stacked=True,
                right=[self.metric(mc.INTENT_TRUNCATIONS, "Sum", "IntentTruncations")],
                right_axis="truncated texts",
            ),
        ]

    def model_latency(self) -> cloudwatch.GraphWidget:
        return _graph(
            self.title("ModelLatency (µs, SageMaker)"),
            left=self.percentiles(mc.SM_MODEL_LATENCY, "ModelLatency"),
            left_axis="microseconds (µs)",
            annotations=_threshold_line(self.alarms, mc.SM_MODEL_LATENCY,
                                        unit="ms SLA", scale=1000),
        )

    def invocations_and_errors(self) -> cloudwatch.GraphWidget:
        return _graph(
            self.title("Invocations and errors"),
            left=[self.metric(mc.SM_INVOCATIONS, "Sum", "Invocations")],
            left_axis="requests per period",
            right=[self.metric(mc.SM_INVOCATION_4XX, "Sum", "Invocation4XXErrors"),
                   self.metric(mc.SM_INVOCATION_5XX, "Sum", "Invocation5XXErrors")],
            right_axis="errors per period",
        )

    def instances_vs_schedule(self) -> cloudwatch.GraphWidget:
        scaling = self.endpoint.scaling
        fleet = self.endpoint.fleet
        zone = scaling.time_zone
        lines = [
            (float(scaling.min_capacity), f"min capacity {scaling.min_capacity}", LIMIT_COLOR),
            (float(scaling.max_capacity), f"max capacity {scaling.max_capacity}", LIMIT_COLOR),
        ]
        for name, floor in (("off-peak", fleet.off_peak),
                            ("business hours", fleet.business_hours)):
            lines.append((float(floor.min_capacity),
                          _floor_label(f"{name} floor {floor.min_capacity}", floor, "min", zone),
                          SCHEDULE_COLOR))
            if floor.max_capacity != scaling.max_capacity:
                lines.append((float(floor.max_capacity),
                              _floor_label(f"{name} ceiling {floor.max_capacity}", floor, "max",
                                           zone), SCHEDULE_COLOR))
        return _graph(
            self.title("Instances vs schedule"),
            left=[self.instance_count(
                "InService instances (Invocations ÷ InvocationsPerInstance; 0 without traffic)"),
                  # The range in force (schedules, release pre-scales, dated events), as the
                  # scaling-limits Lambda publishes it: capacity-pinned-at-max compares with it.
                  self.metric(mc.MAX_CAPACITY_IN_FORCE, "Maximum", "MaxCapacityInForce"),
                  self.metric(mc.MIN_CAPACITY_IN_FORCE, "Minimum", "MinCapacityInForce")],
            left_axis="instances", left_max=float(scaling.max_capacity) + 1,
            annotations=lines,
        )

    def load_vs_target(self) -> list[cloudwatch.IWidget]:
        scaling, fleet = self.endpoint.scaling, self.endpoint.fleet
        sustainable = fleet.per_instance_invocations_per_min
        lines: list[tuple[float, str, str]] = [
            (sustainable, f"sustainable {sustainable:g}/min/instance (capacity model)",
             LIMIT_COLOR)]
        if scaling.tracks_invocations:
            target = fleet.target_invocations_per_instance_per_min
            lines.append((target, f"target tracking {target:g}/min/instance", TARGET_COLOR))
        step = fleet.step_threshold_invocations_per_instance_per_min
        if step is not None:
            lines.append((step, f"step scaling from {step:g}/min/instance", SCHEDULE_COLOR))
        per_minute = cloudwatch.MathExpression(
            # A Sum per period: divided by the period in minutes it stays per minute when the
            # console widens the period for a long time range.
            expression=f"{PER_INSTANCE_ID} / (PERIOD({PER_INSTANCE_ID}) / 60)",
            using_metrics={PER_INSTANCE_ID: self.metric(
                mc.SM_INVOCATIONS_PER_INSTANCE, "Sum", "InvocationsPerInstance")},
            label="InvocationsPerInstance per minute",
            period=PERIOD,
        )
        widgets: list[cloudwatch.IWidget] = [_graph(
            self.title("Invocations per instance vs scaling target"),
            left=[per_minute], left_axis="invocations / min / instance", annotations=lines,
        )]
        concurrency_target = fleet.target_concurrent_requests_per_model
        if scaling.tracks_concurrency and concurrency_target is not None:
            target = concurrency_target
            widgets.append(_graph(
                self.title("Concurrent requests per model vs scaling target"),
                left=[self.metric(mc.SM_CONCURRENT_REQUESTS, "Maximum",
                                  "ConcurrentRequestsPerModel max")],
                left_axis="requests in flight",
                annotations=[(target, f"target tracking {target:g}", TARGET_COLOR)],
            ))
        return widgets

    def cost_per_hour(self) -> cloudwatch.GraphWidget:
        instance, scaling = self.instance, self.endpoint.scaling
        price = instance.on_demand_usd_per_hour
        lines = [
            (scaling.min_capacity * price,
             f"min capacity: {scaling.min_capacity} × {_usd(price)}/h", LIMIT_COLOR),
            (scaling.max_capacity * price,
             f"max capacity: {scaling.max_capacity} × {_usd(price)}/h", LIMIT_COLOR),
        ]
        return _graph(
            self.title("Estimated cost (USD per hour)"),
            left=[self.instance_math(
                f"({INSTANCE_COUNT_EXPRESSION}) * {price!r}",
                f"instances × {_usd(price)}/h ({price_source(instance)})",
            )],
            left_axis="USD / hour", annotations=lines,
        )

    def alarm_status(self) -> cloudwatch.AlarmStatusWidget:
        alarms: list[cloudwatch.IAlarm] = list(self.alarms.alarms.values())
        if self.alarms.page_alarm is not None:
            alarms.insert(0, self.alarms.page_alarm)
        return cloudwatch.AlarmStatusWidget(
            title=self.title("Alarms"),
            alarms=alarms,
            sort_by=cloudwatch.AlarmStatusWidgetSortBy.STATE_UPDATED_TIMESTAMP,
            width=GRID_WIDTH,
            height=2 + (len(alarms) + 3) // 4,
        )


def calendar_widgets(
    *,
    function_name: str,
    environment_name: str,
    alarms: AlarmSet | None,
    failed_runs_queue_name: str | None = None,
) -> list[cloudwatch.IWidget]:
    """The release-calendar Lambda's row: actions written, entries skipped, errors and the
    failed runs kept in its queue, alarms."""
    environment = {"Environment": environment_name}

    def calendar_metric(spec: mc.MetricSpec, statistic: str, label: str) -> cloudwatch.Metric:
        return dashboard_metric(spec, environment, statistic=statistic, label=label,
                                period=CALENDAR_PERIOD)

    skipped_lines = (_threshold_line(alarms, mc.CALENDAR_ENTRIES_SKIPPED, unit="skipped")
                     if alarms is not None else [])
    error_lines = (_threshold_line(alarms, mc.LAMBDA_ERRORS, unit="failed")
                   if alarms is not None else [])
    widgets: list[cloudwatch.IWidget] = [
        cloudwatch.TextWidget(
            markdown=(
                "## Release calendar\n"
                f"Reconciler Lambda (environment `{environment_name}`): dated releases become "
                "pre-scale/restore scheduled actions. Runbook: "
                f"[release-calendar-lambda]({RUNBOOK_BASE_URL}/release-calendar-lambda.md)"
            ),
            width=GRID_WIDTH, height=2,
        ),
        _graph(
            "Release calendar · scheduled actions written",
            left=[calendar_metric(mc.CALENDAR_ACTIONS_CREATED, "Sum", "CalendarActionsCreated"),
                  calendar_metric(mc.CALENDAR_ACTIONS_UPDATED, "Sum", "CalendarActionsUpdated"),
                  calendar_metric(mc.CALENDAR_ACTIONS_DELETED, "Sum", "CalendarActionsDeleted")],
            left_axis="actions per hour",
        ),
        _graph(
            "Release calendar · entries skipped",
            left=[calendar_metric(mc.CALENDAR_ENTRIES_SKIPPED, "Maximum",
                                  "CalendarEntriesSkipped max")],
            left_axis="entries per run", annotations=skipped_lines,
        ),
        _graph(
            "Release calendar · Lambda errors",
            left=[dashboard_metric(mc.LAMBDA_ERRORS, {"FunctionName": function_name},
                                   statistic="Sum", label="Errors",
                                   period=cdk.Duration.minutes(5))],
            left_axis="failed invocations", annotations=error_lines,
        ),
    ]
    if failed_runs_queue_name is not None:
        queued_lines = (_threshold_line(alarms, mc.SQS_MESSAGES_VISIBLE, unit="kept")
                        if alarms is not None else [])
        widgets.append(_graph(
            "Release calendar · failed runs kept (replay: runbook)",
            left=[dashboard_metric(mc.SQS_MESSAGES_VISIBLE, {"QueueName": failed_runs_queue_name},
                                   statistic="Maximum", label="Failed runs in the queue",
                                   period=cdk.Duration.minutes(5))],
            left_axis="messages", annotations=queued_lines,
        ))
    if alarms is not None and alarms.alarms:
        widgets.append(cloudwatch.AlarmStatusWidget(
            title="Release calendar · Alarms", alarms=list(alarms.alarms.values()),
            width=GRID_WIDTH, height=2 + (len(alarms.alarms) + 3) // 4,
        ))
    return widgets


class InferenceDashboard(Construct):
    """The environment's dashboard: an overview line, one section per endpoint, the calendar.

    ``calendar_function_name`` adds the release-calendar row; it needs ``calendar_environment``
    (the ``Environment`` dimension the Lambda publishes with, i.e. the settings' ``name``) and
    may take the Lambda's ``calendar_alarms`` for thresholds and an alarm-status widget, and its
    ``calendar_failed_runs_queue_name`` for the failed runs kept.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        dashboard_name: str,
        endpoints: Sequence[DashboardEndpoint],
        calendar_function_name: str | None = None,
        calendar_environment: str | None = None,
        calendar_alarms: AlarmSet | None = None,
        calendar_failed_runs_queue_name: str | None = None,
    ) -> None:
        super().__init__(scope, id_)
        if not cdk.Token.is_unresolved(dashboard_name) and not DASHBOARD_NAME.match(
            dashboard_name
        ):
            raise ValueError(
                f"dashboard_name {dashboard_name!r} is not accepted: CloudWatch takes 1-255 "
                "letters, digits, '-' and '_'"
            )
        if not endpoints:
            raise ValueError(f"dashboard {dashboard_name}: endpoints is empty; give at least one")
        titles = [endpoint.title for endpoint in endpoints]
        duplicates = sorted({title for title in titles if titles.count(title) > 1})
        if duplicates:
            raise ValueError(
                f"dashboard {dashboard_name}: endpoint title {duplicates[0]!r} is used twice; "
                "widget titles must tell the endpoints apart"
            )
        if (calendar_function_name is None) != (calendar_environment is None):
            raise ValueError(
                f"dashboard {dashboard_name}: calendar_function_name "
                f"{calendar_function_name!r} and calendar_environment {calendar_environment!r}"
                " go together (the Lambda's metrics carry the Environment dimension)"
            )
        if calendar_alarms is not None and calendar_function_name is None:
            raise ValueError(f"dashboard {dashboard_name}: calendar_alarms without "
                             "calendar_function_name")
        if calendar_failed_runs_queue_name is not None and calendar_function_name is None:
            raise ValueError(f"dashboard {dashboard_name}: calendar_failed_runs_queue_name "
                             "without calendar_function_name")

        self.dashboard = cloudwatch.Dashboard(
            self,
            "Dashboard",
            dashboard_name=dashboard_name,
            default_interval=cdk.Duration.hours(6),
            # Periods may widen with the time range: sums are labelled "per period", the
            # per-instance rate is normalized to per minute, and ratios are period-free.
            period_override=cloudwatch.PeriodOverride.AUTO,
        )
        self.dashboard.add_widgets(self._overview(endpoints))
        for endpoint in endpoints:
            # One call per section: its widgets run left to right, wrapping at 24 columns.
            self.dashboard.add_widgets(*_EndpointSection(endpoint).widgets())
        if calendar_function_name is not None and calendar_environment is not None:
            self.dashboard.add_widgets(*calendar_widgets(
                function_name=calendar_function_name,
                environment_name=calendar_environment,
                alarms=calendar_alarms,
                failed_runs_queue_name=calendar_failed_runs_queue_name,
            ))

    @staticmethod
    def _overview(endpoints: Sequence[DashboardEndpoint]) -> cloudwatch.TextWidget:
        sources = sorted({price_source(endpoint.instance) for endpoint in endpoints})
        markdown = (
            "# MangaAssist inference\n"
            "Read GPU memory, KV-cache usage, queue and time to first token together (seed "
            "002). Gateway and classifier latencies are in **ms**, SageMaker's ModelLatency in "
            "**µs**. Instance counts are Invocations ÷ InvocationsPerInstance (0 while idle). "
            f"Costs are approximate: {'; '.join(sources)}. Every alarm links its runbook: "
            f"[index]({RUNBOOK_BASE_URL}/README.md)."
        )
        return cloudwatch.TextWidget(markdown=markdown, width=GRID_WIDTH, height=2)
