"""The metrics contract: every metric the platform emits or alarms on, named once.

The serving containers emit custom metrics as CloudWatch Embedded Metric Format (EMF) lines on
stdout; SageMaker ships container stdout to CloudWatch Logs, which extracts them. The stacks build
alarms and dashboard widgets from the same :class:`MetricSpec` objects, so an alarm can never point
at a metric nobody emits: :func:`emf_document` refuses a metric or dimension set that is not in the
contract, and the stacks have no other way to name a custom metric.

A dimension whose values are a closed set (the ``Bucket`` of ``AdmissionRejections``: the request
buckets of :mod:`request_buckets`) declares them, and :func:`emf_document` refuses any other value,
so every value emitted is one the dashboard draws a line for.

Pure module: no AWS, CDK or web-framework imports.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from request_buckets import REJECTION_BUCKETS

NAMESPACE = "MangaAssist/Inference"
"""CloudWatch namespace of every custom metric the containers and Lambdas emit."""

SAGEMAKER_NAMESPACE = "AWS/SageMaker"
SAGEMAKER_ENDPOINT_NAMESPACE = "/aws/sagemaker/Endpoints"

ENDPOINT_DIMENSIONS: tuple[str, ...] = ("EndpointName", "VariantName")
"""Dimensions of every per-endpoint metric, ours and SageMaker's."""


# (str, Enum) rather than StrEnum: the Inf1 serving image runs Python 3.10, which has no StrEnum.
class Unit(str, Enum):  # noqa: UP042
    """CloudWatch units used by the contract (the exact strings CloudWatch accepts)."""

    COUNT = "Count"
    MILLISECONDS = "Milliseconds"
    MICROSECONDS = "Microseconds"
    PERCENT = "Percent"
    NONE = "None"


class Emitter(str, Enum):  # noqa: UP042
    """Who puts the metric into CloudWatch."""

    GATEWAY = "gateway"
    CLASSIFIER = "classifier"
    CALENDAR_LAMBDA = "release-calendar-lambda"
    SCALING_LIMITS_LAMBDA = "scaling-limits-lambda"
    SAGEMAKER = "sagemaker"
    AWS_LAMBDA = "aws-lambda"
    AWS_SQS = "aws-sqs"


@dataclass(frozen=True)
class MetricSpec:
    """One metric: where it lives, what it measures, and the dimensions it is published with."""

    name: str
    unit: Unit
    description: str
    emitter: Emitter
    namespace: str = NAMESPACE
    dimensions: tuple[str, ...] = ENDPOINT_DIMENSIONS
    dimension_values: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(dimension, every value it may take) for dimensions with a closed set of values."""

    def values_of(self, dimension: str) -> tuple[str, ...] | None:
        """The values ``dimension`` may take, or None when it is open (endpoint names...)."""
        return dict(self.dimension_values).get(dimension)

    @property
    def is_custom(self) -> bool:
        """True for metrics our own code emits (as opposed to AWS services' built-in ones)."""
        return self.emitter not in (Emitter.SAGEMAKER, Emitter.AWS_LAMBDA, Emitter.AWS_SQS)


# --- LLM gateway -------------------------------------------------------------------------------
REQUESTS = MetricSpec("Requests", Unit.COUNT, "Chat requests accepted for generation.",
                      Emitter.GATEWAY)
CLIENT_ERRORS = MetricSpec("ClientErrors", Unit.COUNT,
                           "Requests refused as invalid (4xx other than admission shedding).",
                           Emitter.GATEWAY)
PROMPT_TOKENS = MetricSpec("PromptTokens", Unit.COUNT,
                           "Prompt tokens sent to the engine after the context budget.",
                           Emitter.GATEWAY)
CACHED_PROMPT_TOKENS = MetricSpec(
    "CachedPromptTokens", Unit.COUNT,
    "Prompt tokens the engine served from its prefix cache instead of prefilling them (vLLM "
    "num_cached_tokens); CachedPromptTokens / PromptTokens is the prefix-cache hit rate.",
    Emitter.GATEWAY)
COMPLETION_TOKENS = MetricSpec("CompletionTokens", Unit.COUNT, "Tokens generated.",
                               Emitter.GATEWAY)
CONTEXT_TRUNCATIONS = MetricSpec("ContextTruncations", Unit.COUNT,
                                 "Requests whose history was trimmed by the sliding window.",
                                 Emitter.GATEWAY)
DROPPED_TURNS = MetricSpec("DroppedTurns", Unit.COUNT,
                           "Conversation turns dropped by the sliding window.", Emitter.GATEWAY)
ADMISSION_REJECTIONS = MetricSpec(
    "AdmissionRejections", Unit.COUNT,
    "Requests shed by KV-aware admission (429/503 with Retry-After), per request bucket "
    "(Unsized: refused before the request was parsed).",
    Emitter.GATEWAY, dimensions=(*ENDPOINT_DIMENSIONS, "Bucket"),
    dimension_values=(("Bucket", REJECTION_BUCKETS),))
REFUSALS_WHILE_IDLE = MetricSpec(
    "RefusalsWhileIdle", Unit.COUNT,
    "Requests refused with 429 ttft_slo while the engine was nearly idle (nothing queued, at "
    "most a tenth of ENGINE_MAX_NUM_SEQS running): the prefill valve's measured rate, not the "
    "load, turned them away; a lock-out when it lasts "
    "(docs/design-decisions.md#admission-lock-out).",
    Emitter.GATEWAY)
SESSIONS_OPENED = MetricSpec(
    "SessionsOpened", Unit.COUNT,
    "SageMaker stateful sessions this instance opened (sticky routing for a conversation).",
    Emitter.GATEWAY)
SESSION_MISSES = MetricSpec(
    "SessionMisses", Unit.COUNT,
    "Requests naming a session this instance does not hold (expired, closed, or opened on an "
    "instance that is gone): served as usual, without the conversation's cached prefix.",
    Emitter.GATEWAY)
QUEUE_WAIT = MetricSpec("QueueWait", Unit.MILLISECONDS,
                        "Time a request waited for admission before reaching the engine.",
                        Emitter.GATEWAY)
TIME_TO_FIRST_TOKEN = MetricSpec("TimeToFirstToken", Unit.MILLISECONDS,
                                 "From admission to the first generated token.", Emitter.GATEWAY)
RESPONSE_MODES: tuple[str, ...] = ("streamed", "whole")
"""Values of the ``Mode`` dimension of :data:`FIRST_RESPONSE_LATENCY`: a streamed request's first
response is its first token's chunk, a non-streamed request's is the whole answer."""
FIRST_RESPONSE_LATENCY = MetricSpec(
    "FirstResponseLatency", Unit.MILLISECONDS,
    "From the request's arrival to the first answer the caller gets: a streamed request's first "
    "token (its chunk), a non-streamed request's whole response, a refusal's 429/503 (the "
    "caller waited that long to be told). Every request but client errors (4xx other than "
    "shedding) and warmup; per Mode (streamed, whole). Seed 001's P99.9 first response < 5 s.",
    Emitter.GATEWAY, dimensions=(*ENDPOINT_DIMENSIONS, "Mode"),
    dimension_values=(("Mode", RESPONSE_MODES),))
TIME_PER_OUTPUT_TOKEN = MetricSpec(
    "TimePerOutputToken", Unit.MILLISECONDS,
    "The stream's pace: from the first to the last generated token, divided by the tokens after "
    "the first (requests that generated at least two tokens).", Emitter.GATEWAY)
REQUEST_LATENCY = MetricSpec("RequestLatency", Unit.MILLISECONDS,
                             "Whole request inside the gateway, validation to last byte.",
                             Emitter.GATEWAY)
FALLBACKS = MetricSpec("Fallbacks", Unit.COUNT,
                       "Requests answered with the controlled fallback instead of generation.",
                       Emitter.GATEWAY)
OOM_CIRCUIT_TRIPS = MetricSpec("OOMCircuitTrips", Unit.COUNT,
                               "Engine OOMs or deaths that opened the circuit breaker.",
                               Emitter.GATEWAY)
BREAKER_STATE = MetricSpec("BreakerState", Unit.NONE,
                           "Circuit breaker state: 0 closed, 1 half-open, 2 open.",
                           Emitter.GATEWAY)
ENGINE_RESTARTS = MetricSpec("EngineRestarts", Unit.COUNT,
                             "In-process rebuilds of a dead inference engine.", Emitter.GATEWAY)
KV_CACHE_USAGE = MetricSpec("KVCacheUsage", Unit.PERCENT,
                            "Share of the engine's KV-cache blocks in use (0-100).",
                            Emitter.GATEWAY)
RUNNING_REQUESTS = MetricSpec("RunningRequests", Unit.COUNT,
                              "Sequences the engine is generating for.", Emitter.GATEWAY)
WAITING_REQUESTS = MetricSpec("WaitingRequests", Unit.COUNT,
                              "Requests queued in the engine or waiting for admission.",
                              Emitter.GATEWAY)
PREEMPTIONS = MetricSpec("Preemptions", Unit.COUNT,
                         "Sequences preempted (and later recomputed) for lack of KV blocks.",
                         Emitter.GATEWAY)

# --- intent classifier -------------------------------------------------------------------------
INTENT_LATENCY = MetricSpec("IntentLatency", Unit.MILLISECONDS,
                            "Classifier inference time for one request (tokenize + model).",
                            Emitter.CLASSIFIER)
INTENT_PREDICTIONS = MetricSpec("IntentPredictions", Unit.COUNT,
                                "Texts classified, per predicted intent.", Emitter.CLASSIFIER,
                                dimensions=(*ENDPOINT_DIMENSIONS, "Intent"))
INTENT_TRUNCATIONS = MetricSpec("IntentTruncations", Unit.COUNT,
                                "Texts longer than the traced sequence length, truncated.",
                                Emitter.CLASSIFIER)

# --- release-calendar Lambda -------------------------------------------------------------------
CALENDAR_DIMENSIONS: tuple[str, ...] = ("Environment",)
CALENDAR_ACTIONS_CREATED = MetricSpec("CalendarActionsCreated", Unit.COUNT,
                                      "Scheduled actions the reconciler created.",
                                      Emitter.CALENDAR_LAMBDA, dimensions=CALENDAR_DIMENSIONS)
CALENDAR_ACTIONS_UPDATED = MetricSpec("CalendarActionsUpdated", Unit.COUNT,
                                      "Scheduled actions the reconciler changed.",
                                      Emitter.CALENDAR_LAMBDA, dimensions=CALENDAR_DIMENSIONS)
CALENDAR_ACTIONS_DELETED = MetricSpec("CalendarActionsDeleted", Unit.COUNT,
                                      "Expired or removed scheduled actions it deleted.",
                                      Emitter.CALENDAR_LAMBDA, dimensions=CALENDAR_DIMENSIONS)
CALENDAR_ENTRIES_SKIPPED = MetricSpec("CalendarEntriesSkipped", Unit.COUNT,
                                      "Calendar entries skipped because they are invalid.",
                                      Emitter.CALENDAR_LAMBDA, dimensions=CALENDAR_DIMENSIONS)

# --- scaling-limits Lambda (the capacity range in force, once a minute) -------------------------
MAX_CAPACITY_IN_FORCE = MetricSpec(
    "MaxCapacityInForce", Unit.COUNT,
    "The variant's MaxCapacity in force now, as Application Auto Scaling reports it: the daily "
    "schedule's, a release pre-scale's, or the registered maximum.",
    Emitter.SCALING_LIMITS_LAMBDA)
MIN_CAPACITY_IN_FORCE = MetricSpec(
    "MinCapacityInForce", Unit.COUNT,
    "The variant's MinCapacity in force now (the schedule's floor or a release pre-scale's).",
    Emitter.SCALING_LIMITS_LAMBDA)

# --- SageMaker's own metrics (alarmed on, never emitted by us) ----------------------------------
SM_INVOCATIONS = MetricSpec("Invocations", Unit.COUNT, "Requests sent to the variant.",
                            Emitter.SAGEMAKER, namespace=SAGEMAKER_NAMESPACE)
SM_INVOCATIONS_PER_INSTANCE = MetricSpec("InvocationsPerInstance", Unit.COUNT,
                                         "Invocations divided by InService instances.",
                                         Emitter.SAGEMAKER, namespace=SAGEMAKER_NAMESPACE)
SM_INVOCATION_5XX = MetricSpec("Invocation5XXErrors", Unit.COUNT,
                               "Requests the model answered with a 5xx.", Emitter.SAGEMAKER,
                               namespace=SAGEMAKER_NAMESPACE)
SM_INVOCATION_4XX = MetricSpec("Invocation4XXErrors", Unit.COUNT,
                               "Requests the model answered with a 4xx.", Emitter.SAGEMAKER,
                               namespace=SAGEMAKER_NAMESPACE)
SM_MODEL_LATENCY = MetricSpec("ModelLatency", Unit.MICROSECONDS,
                              "Time the container took to answer (microseconds).",
                              Emitter.SAGEMAKER, namespace=SAGEMAKER_NAMESPACE)
SM_OVERHEAD_LATENCY = MetricSpec("OverheadLatency", Unit.MICROSECONDS,
                                 "SageMaker's own overhead per request (microseconds).",
                                 Emitter.SAGEMAKER, namespace=SAGEMAKER_NAMESPACE)
SM_CONCURRENT_REQUESTS = MetricSpec("ConcurrentRequestsPerModel", Unit.COUNT,
                                    "In-flight requests per model (10 s resolution).",
                                    Emitter.SAGEMAKER, namespace=SAGEMAKER_NAMESPACE)
SM_GPU_MEMORY_UTILIZATION = MetricSpec("GPUMemoryUtilization", Unit.PERCENT,
                                       "GPU memory in use, 0-100 per GPU (summed over GPUs).",
                                       Emitter.SAGEMAKER, namespace=SAGEMAKER_ENDPOINT_NAMESPACE)
SM_GPU_UTILIZATION = MetricSpec("GPUUtilization", Unit.PERCENT,
                                "GPU compute busy, 0-100 per GPU (summed over GPUs).",
                                Emitter.SAGEMAKER, namespace=SAGEMAKER_ENDPOINT_NAMESPACE)
SM_CPU_UTILIZATION = MetricSpec("CPUUtilization", Unit.PERCENT,
                                "CPU busy, 0-100 per core (summed over cores).",
                                Emitter.SAGEMAKER, namespace=SAGEMAKER_ENDPOINT_NAMESPACE)
SM_MEMORY_UTILIZATION = MetricSpec("MemoryUtilization", Unit.PERCENT, "Host memory in use.",
                                   Emitter.SAGEMAKER, namespace=SAGEMAKER_ENDPOINT_NAMESPACE)

# --- AWS Lambda's own metrics (the release-calendar function) ----------------------------------
LAMBDA_NAMESPACE = "AWS/Lambda"
LAMBDA_ERRORS = MetricSpec("Errors", Unit.COUNT, "Invocations that ended in an error.",
                           Emitter.AWS_LAMBDA, namespace=LAMBDA_NAMESPACE,
                           dimensions=("FunctionName",))
LAMBDA_DESTINATION_DELIVERY_FAILURES = MetricSpec(
    "DestinationDeliveryFailures", Unit.COUNT,
    "Invocation records Lambda could not send to the function's on-failure destination.",
    Emitter.AWS_LAMBDA, namespace=LAMBDA_NAMESPACE, dimensions=("FunctionName",))

# --- Amazon SQS's own metrics (the release-calendar Lambda's failed-runs queue) -----------------
SQS_NAMESPACE = "AWS/SQS"
SQS_MESSAGES_VISIBLE = MetricSpec(
    "ApproximateNumberOfMessagesVisible", Unit.COUNT,
    "Messages waiting in the queue (here: failed calendar runs not yet replayed).",
    Emitter.AWS_SQS, namespace=SQS_NAMESPACE, dimensions=("QueueName",))

ALL_METRICS: tuple[MetricSpec, ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, MetricSpec)
)
"""Every metric in the contract, in declaration order."""

_BY_KEY: dict[tuple[str, str], MetricSpec] = {(m.namespace, m.name): m for m in ALL_METRICS}
if len(_BY_KEY) != len(ALL_METRICS):  # pragma: no cover - guards edits to this file
    raise RuntimeError("metrics_contract: two metrics share a namespace and name")

BREAKER_STATE_VALUES: Mapping[str, int] = {"closed": 0, "half_open": 1, "open": 2}
"""How :data:`BREAKER_STATE` encodes the circuit breaker's states."""


def metric(name: str, namespace: str = NAMESPACE) -> MetricSpec:
    """Look a metric up by name; raise KeyError listing the known names if it is not there."""
    try:
        return _BY_KEY[(namespace, name)]
    except KeyError:
        known = sorted(m.name for m in ALL_METRICS if m.namespace == namespace)
        raise KeyError(
            f"metric {name!r} is not in the contract for namespace {namespace!r}; "
            f"known: {', '.join(known)}"
        ) from None


MetricGroup = tuple[Mapping[MetricSpec, float], Mapping[str, str]]
"""Metrics that share a dimension set, and that set's values."""


def emf_document(
    values: Mapping[MetricSpec, float],
    dimensions: Mapping[str, str],
    *,
    timestamp_ms: int,
    properties: Mapping[str, Any] | None = None,
    also: Sequence[MetricGroup] = (),
) -> dict[str, Any]:
    """Build one CloudWatch EMF document for metrics that share a dimension set.

    Every metric must be a custom metric of the contract published with exactly the keys of
    ``dimensions``; anything else raises ValueError, so no code path can emit a metric the alarms
    do not know about. ``properties`` are extra, non-metric fields (searchable in Logs Insights).

    ``also``: further groups of metrics, each with its own dimension set, in the same document
    (one more metric directive each: "CloudWatchMetrics: An array of MetricDirective objects",
    CloudWatch EMF specification), so one request stays one line. The groups share the
    document's root, so a dimension two groups both carry must have the same value in both.
    """
    groups: list[MetricGroup] = [(values, dimensions), *also]
    directives: list[dict[str, Any]] = []
    document: dict[str, Any] = dict(properties or {})
    roots: dict[str, str] = {}
    for group_values, group_dimensions in groups:
        directive, numbers = _directive(group_values, group_dimensions)
        for key, dim_value in group_dimensions.items():
            if roots.setdefault(key, str(dim_value)) != str(dim_value):
                raise ValueError(f"emf_document: dimension {key} is {roots[key]!r} in one group "
                                 f"and {dim_value!r} in another")
        clash = set(numbers) & {m["Name"] for d in directives for m in d["Metrics"]}
        if clash:
            raise ValueError(f"emf_document: {sorted(clash)} given in two groups")
        directives.append(directive)
        document.update(numbers)
    document.update(roots)
    document["_aws"] = {"Timestamp": int(timestamp_ms), "CloudWatchMetrics": directives}
    return document


def _directive(values: Mapping[MetricSpec, float], dimensions: Mapping[str, str]
               ) -> tuple[dict[str, Any], dict[str, float]]:
    """One metric directive and its metrics' values, checked against the contract."""
    if not values:
        raise ValueError("emf_document: no metric values given")
    dim_keys = tuple(dimensions)
    namespaces = {spec.namespace for spec in values}
    if len(namespaces) != 1:
        raise ValueError(f"emf_document: metrics span namespaces {sorted(namespaces)}")
    definitions: list[dict[str, str]] = []
    numbers: dict[str, float] = {}
    for spec, value in values.items():
        if not spec.is_custom or _BY_KEY.get((spec.namespace, spec.name)) is not spec:
            raise ValueError(f"emf_document: {spec.name!r} is not a custom metric of the contract")
        if set(spec.dimensions) != set(dim_keys):
            raise ValueError(
                f"emf_document: {spec.name} is published with dimensions {list(spec.dimensions)},"
                f" got {list(dim_keys)}"
            )
        for dimension, accepted in spec.dimension_values:
            if str(dimensions[dimension]) not in accepted:
                raise ValueError(
                    f"emf_document: {spec.name} {dimension}={dimensions[dimension]!r} is not "
                    f"accepted; accepted: {', '.join(accepted)}"
                )
        number = float(value)
        if math.isnan(number) or math.isinf(number):
            raise ValueError(f"emf_document: {spec.name} value {value!r} is not a finite number")
        definitions.append({"Name": spec.name, "Unit": spec.unit.value})
        numbers[spec.name] = number
    directive = {"Namespace": namespaces.pop(), "Dimensions": [list(dim_keys)],
                 "Metrics": definitions}
    return directive, numbers
