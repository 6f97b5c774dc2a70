"""Per-environment settings: one YAML file per environment, one typed, validated model.

``config/<env>.yaml`` is read here and nowhere else; every stack and construct receives the
validated :class:`EnvironmentSettings`. Unknown keys are errors (a typo must not silently fall back
to a default), and a bad value stops synth with :class:`SettingsError`, whose message names the
file, the field path, the value and what is accepted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from gpu_budget.engine_args import DEFAULT_BLOCK_SIZE, ENGINE_ARG
from serving_contract import (
    ADAPTER_NAME_PATTERN,
    BASE_ROUTE,
    DIRECTORY_PATTERN,
    LOCALE_PATTERN,
    RESERVED_NAMES,
    SERVED_MODEL_NAME_PATTERN,
)

if TYPE_CHECKING:
    from capacity_model import (
        DailyProfile,
        DecodeSpeedTable,
        FleetPlan,
        FleetPolicy,
        LlmCapacity,
        StepBand,
    )
    from gpu_budget import MemoryPlan

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "config"
DEFAULT_ENVIRONMENTS: tuple[str, ...] = ("dev", "prod")
"""Environments ``app.py`` synthesizes when none is chosen (the embedded default)."""
FOUNDATION_STACK_ID = "Foundation"
SERVING_STACK_ID = "Serving"
"""Stack ids inside each environment's Stage; CloudFormation names them <stage_name>-<id>."""

# Regions with SageMaker real-time inference on GPU instances we use; extend as the platform moves.
KNOWN_REGIONS: frozenset[str] = frozenset(
    {
        "ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-southeast-1", "ap-southeast-2",
        "ap-south-1", "ca-central-1", "eu-central-1", "eu-north-1", "eu-west-1", "eu-west-2",
        "eu-west-3", "sa-east-1", "us-east-1", "us-east-2", "us-west-1", "us-west-2",
    }
)

AccountId = Annotated[str, StringConstraints(pattern=r"^\d{12}$")]
EnvironmentName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{1,15}$")]
Email = Annotated[str, StringConstraints(pattern=r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$")]
TagValue = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class SettingsError(ValueError):
    """A configuration file is missing, unreadable or invalid. The message is for a person."""


LOG_RETENTION_DAYS: dict[int, str] = {
    365: "ONE_YEAR", 400: "THIRTEEN_MONTHS", 545: "EIGHTEEN_MONTHS", 731: "TWO_YEARS",
    1096: "THREE_YEARS", 1827: "FIVE_YEARS", 2192: "SIX_YEARS", 2557: "SEVEN_YEARS",
    2922: "EIGHT_YEARS", 3288: "NINE_YEARS", 3653: "TEN_YEARS",
}
"""CloudWatch Logs retention periods of a year or more (PutRetentionPolicy's allowed values) ->
CDK's ``RetentionDays`` member. Shorter ones are refused: AWS Control Tower's proactive control
CT.CLOUDWATCH.PR.2 "Require an Amazon CloudWatch log group to be retained for at least one year",
and a year of these small log groups costs cents (docs/design-decisions.md#log-retention)."""

LogRetentionDays = Literal[365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653]
S3Prefix = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9!_.*'()/-]*[^/]$")]


class _Strict(BaseModel):
    """Base for every settings model: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class AlertSettings(_Strict):
    """Who hears the alarms: the encrypted SNS topic's subscribers."""

    email_subscribers: list[Email] = Field(
        default_factory=list,
        description="Addresses subscribed to the alarm topic (each must confirm by email).",
    )


class ArtifactBucketSettings(_Strict):
    """The model-artifact bucket (AWQ weights, LoRA adapters, compiled Neuron models)."""

    removal_policy: Literal["retain", "destroy"] = Field(
        "retain",
        description="What CloudFormation does with the bucket when the stack is deleted. "
        "'destroy' only works on an empty bucket.",
    )
    noncurrent_version_expiration_days: int = Field(
        90, ge=1, le=3650, description="Days a replaced object version is kept."
    )
    access_log_retention_days: int = Field(
        365, ge=1, le=3650, description="Days server access logs are kept."
    )
    models_prefix: S3Prefix = Field(
        "models",
        description="Prefix under which every served model lives: llm.model.artifact_prefix and "
        "intent.artifact_key must be inside it, quantization's base models, candidates and "
        "reports outside. The deploy role reads and publishes under it only, so a promotion to a "
        "new llm.model.artifact_prefix needs no new role policy (tools/deploy_role.py).",
    )


LocalTime = Annotated[str, StringConstraints(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")]


class DailyWindowSettings(_Strict):
    """A daily scheduled action: from ``start`` (local time) until the other window starts.

    Its minimum and maximum are not typed here: the capacity model derives them from the traffic
    the window expects (:mod:`capacity_model.fleet`). ``surge_allowance`` is how far above the
    window's busiest expected hour the fleet may grow before ``capacity-pinned-at-max`` pages
    (1.0 = twice the expected load); absent, the window's maximum is ``max_capacity``.
    """

    start: LocalTime = Field(description="Local time, HH:MM, in scaling.time_zone.")
    surge_allowance: float | None = Field(
        None, ge=0, le=20,
        description="Share above the busiest expected hour the maximum allows (absent: "
        "max_capacity).",
    )


class StepBandSettings(_Strict):
    """Add ``add_instances`` while the metric is between threshold × (1 + lower) and threshold ×
    (1 + upper): bounds are multiples of the threshold (the capacity model's target) above it."""

    lower: float = Field(ge=0, description="Multiple of the threshold above it (0 = at it).")
    upper: float | None = Field(None, gt=0, description="Open-ended when absent.")
    add_instances: int = Field(ge=1, le=50)


class StepScalingSettings(_Strict):
    """Step scaling from a 1-minute InvocationsPerInstance alarm
    (docs/design-decisions.md#step-scaling).

    The alarm's threshold is the target-tracking target the capacity model derives; the bands
    are multiples of it (+2 above the threshold, +4 from 2×, +8 from 4×).
    """

    bands: list[StepBandSettings] = Field(
        default_factory=lambda: [
            StepBandSettings(lower=0, upper=1, add_instances=2),
            StepBandSettings(lower=1, upper=3, add_instances=4),
            StepBandSettings(lower=3, upper=None, add_instances=8),
        ]
    )
    cooldown_s: int = Field(60, ge=0, le=3600)

    @model_validator(mode="after")
    def _contiguous(self) -> StepScalingSettings:
        from capacity_model import FleetError, check_bands

        if not self.bands:
            raise ValueError("bands: at least one band is required")
        try:
            check_bands(self.step_bands())
        except FleetError as error:
            raise ValueError(str(error)) from None
        return self

    def step_bands(self) -> tuple[StepBand, ...]:
        """The bands as the capacity model reads them."""
        from capacity_model import StepBand

        return tuple(StepBand(b.lower, b.upper, b.add_instances) for b in self.bands)


class ReleaseCalendarCapacitySettings(_Strict):
    """Whether this endpoint follows the release calendar.

    The calendar's capacity formula is fed by the capacity model: the load is the traffic
    profile's busiest hour, the per-instance figure what one instance sustains, the headroom
    the one the fleet keeps (:meth:`capacity_model.FleetPlan.calendar_model`).
    """

    enabled: bool = True


class TrafficProfileSettings(_Strict):
    """The traffic an endpoint expects over a typical day, by local hour (scaling.time_zone)."""

    hourly_invocations_per_min: list[float] = Field(
        min_length=24, max_length=24,
        description="Invocations per minute expected at each local hour, 00:00 first.",
    )
    source: str = Field(min_length=1, description="Where the figures come from.")

    @field_validator("hourly_invocations_per_min")
    @classmethod
    def _non_negative(cls, value: list[float]) -> list[float]:
        bad = [hour for hour, load in enumerate(value) if not (math.isfinite(load) and load >= 0)]
        if bad:
            raise ValueError(f"hour {bad[0]:02d}:00 is {value[bad[0]]!r}; accepted: a number "
                             ">= 0")
        if max(value) <= 0:
            raise ValueError("every hour is 0; accepted: the traffic the endpoint expects")
        return value

    def profile(self) -> DailyProfile:
        """The capacity model's view."""
        from capacity_model import DailyProfile

        return DailyProfile(tuple(self.hourly_invocations_per_min), self.source)


class SurgeSettings(_Strict):
    """An unplanned rise: ``multiplier`` times the load within ``rise_min`` minutes."""

    multiplier: float = Field(ge=1, le=20)
    rise_min: float = Field(gt=0, le=1440)


TRACKING_DATAPOINTS = 3
"""Application Auto Scaling's target-tracking scale-out alarm needs 3 consecutive datapoints
(the simulator's ``tracking_high_datapoints``): 3 minutes on InvocationsPerInstance, 30 s on the
10-second ConcurrentRequestsPerModel."""
HIGH_RESOLUTION_PERIOD_S = 10
"""SageMaker's high-resolution ConcurrentRequestsPerModel "emits data every 10 seconds" (SageMaker
Developer Guide, Define a scaling policy)."""


class ScalingSettings(_Strict):
    """Application Auto Scaling of one endpoint variant: limits, the policies' shape, the traffic.

    No capacity figure is typed here: targets, step thresholds, the daily windows' minima and
    maxima and the release calendar's inputs come from the capacity model
    (:meth:`fleet_policy` + the endpoint's instance capacity → :func:`capacity_model.fleet_plan`).
    """

    min_capacity: int = Field(ge=1, le=100, description="Also the initial instance count.")
    max_capacity: int = Field(ge=1, le=100)
    target_metric: Literal["invocations_per_instance", "concurrent_requests_per_model", "both"] = (
        Field("invocations_per_instance",
              description="Target tracking on InvocationsPerInstance, on the high-resolution "
              "ConcurrentRequestsPerModel, or a policy on each (the largest wins).")
    )
    scale_out_cooldown_s: int = Field(60, ge=0, le=3600)
    scale_in_cooldown_s: int = Field(600, ge=0, le=86400)
    step_scaling: StepScalingSettings | None = Field(default_factory=StepScalingSettings)
    time_zone: str = Field("Asia/Tokyo", description="IANA zone of every schedule.")
    off_peak: DailyWindowSettings
    business_hours: DailyWindowSettings
    traffic: TrafficProfileSettings
    unplanned_surge: SurgeSettings = Field(
        default_factory=lambda: SurgeSettings(multiplier=1.5, rise_min=15),
        description="The rise the fleet absorbs unaided while new instances start: it sets "
        "the headroom.",
    )
    provisioning_delay_s: int = Field(
        360, ge=0, le=3600,
        description="From a scale-out decision to a new instance serving (5-8 min, "
        "docs/design-decisions.md#provisioning-delay).",
    )
    release_calendar: ReleaseCalendarCapacitySettings | None = None

    @field_validator("time_zone")
    @classmethod
    def _iana_zone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError("is not an IANA time zone (e.g. Asia/Tokyo)") from None
        return value

    @model_validator(mode="after")
    def _limits(self) -> ScalingSettings:
        if self.min_capacity > self.max_capacity:
            raise ValueError(
                f"min_capacity {self.min_capacity} is above max_capacity {self.max_capacity}"
            )
        if self.off_peak.start == self.business_hours.start:
            raise ValueError("off_peak.start and business_hours.start must differ")
        return self

    @property
    def tracks_invocations(self) -> bool:
        """Whether a target-tracking policy follows InvocationsPerInstance."""
        return self.target_metric in ("invocations_per_instance", "both")

    @property
    def tracks_concurrency(self) -> bool:
        """Whether a target-tracking policy follows the high-resolution concurrency metric."""
        return self.target_metric in ("concurrent_requests_per_model", "both")

    def fleet_policy(self) -> FleetPolicy:
        """The capacity model's view of the policy (no capacity figures in it)."""
        import datetime as dt

        from capacity_model import FleetPolicy, Surge

        tracking_period_s = HIGH_RESOLUTION_PERIOD_S if self.tracks_concurrency else 60
        return FleetPolicy(
            min_capacity=self.min_capacity,
            max_capacity=self.max_capacity,
            time_zone=self.time_zone,
            off_peak_start=dt.time.fromisoformat(self.off_peak.start),
            business_hours_start=dt.time.fromisoformat(self.business_hours.start),
            off_peak_surge_allowance=self.off_peak.surge_allowance,
            business_hours_surge_allowance=self.business_hours.surge_allowance,
            step_bands=self.step_scaling.step_bands() if self.step_scaling else (),
            step_evaluation_s=60,
            tracking_evaluation_s=TRACKING_DATAPOINTS * tracking_period_s,
            provisioning_s=self.provisioning_delay_s,
            unplanned_surge=Surge(self.unplanned_surge.multiplier, self.unplanned_surge.rise_min),
        )


class NetworkSettings(_Strict):
    """The models' private VPC."""

    cidr: Annotated[str, StringConstraints(pattern=r"^\d{1,3}(\.\d{1,3}){3}/(1[6-9]|2[0-4])$")] = (
        "10.40.0.0/20"
    )
    availability_zone_count: int = Field(
        2, ge=2, le=3,
        description="AZs of the isolated subnets, chosen by CloudFormation (Fn::GetAZs) in the "
        "stack's region, so synth never looks them up.",
    )
    flow_log_retention_days: LogRetentionDays = Field(
        365, description="VPC flow logs. At least a year (AWS Control Tower CT.CLOUDWATCH.PR.2).")


class EndpointAlarmSettings(_Strict):
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


# What the stack writes into the LLM container and the gateway parses: one contract for both.
AdapterName = Annotated[str, StringConstraints(pattern=ADAPTER_NAME_PATTERN.pattern)]
FolderName = Annotated[str, StringConstraints(pattern=DIRECTORY_PATTERN.pattern)]
LocaleTag = Annotated[str, StringConstraints(pattern=LOCALE_PATTERN.pattern)]
RepoRelativePath = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_./-]+$")]


def _engine_table_choice(name: str, value: int) -> int:
    """``value`` if the engine-argument table's row ``name`` accepts it, else ValueError."""
    choices = ENGINE_ARG[name].choices
    if value not in choices:
        raise ValueError(f"must be one of {', '.join(map(str, choices))}")
    return value


class LoraAdapterSettings(_Strict):
    """One LoRA adapter served on the shared base model."""

    name: AdapterName = Field(description="Name clients put in `model` (vLLM's convention).")
    directory: FolderName | None = Field(
        None, description="Folder under <artifact_prefix>/adapters/ (default: the name)."
    )
    rank: int = Field(description="LoRA rank r of the adapter (vLLM accepts 1, 8, 16, ... 512).")

    @property
    def folder(self) -> str:
        """Folder name under ``adapters/`` in the model data."""
        return self.directory or self.name

    @field_validator("rank")
    @classmethod
    def _vllm_rank(cls, value: int) -> int:
        return _engine_table_choice("max_lora_rank", value)


class BaseModelSettings(_Strict):
    """The served base model: its architecture (for the GPU budget) and where its weights are."""

    config: RepoRelativePath = Field(
        description="Hugging Face config.json of the model, relative to the repo root."
    )
    quantization: str = Field(
        description="Checkpoint format: bf16, fp16, int8, awq, awq-g64, w4a16, w4a16-g64."
    )
    served_model_name: Annotated[str, StringConstraints(pattern=SERVED_MODEL_NAME_PATTERN.pattern)]
    base_model: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")] = Field(
        description="Hugging Face id of the model the weights were quantized from and the LoRA "
        "adapters trained on (e.g. meta-llama/Meta-Llama-3-8B-Instruct); `make publish` refuses "
        "an adapter whose adapter_config.json names another base model."
    )
    artifact_prefix: S3Prefix = Field(
        description="Prefix in the artifact bucket holding the weights and tokenizer; LoRA "
        "adapters live under <prefix>/adapters/<name>/."
    )

    @field_validator("config")
    @classmethod
    def _config_exists(cls, value: str) -> str:
        if not (REPO_ROOT / value).is_file():
            available = sorted(
                str(p.relative_to(REPO_ROOT)) for p in (CONFIG_DIR / "models").glob("*.json")
            )
            raise ValueError(f"no such file; available: {', '.join(available)}")
        return value

    @field_validator("quantization")
    @classmethod
    def _known_quantization(cls, value: str) -> str:
        from gpu_budget import parse_quantization

        parse_quantization(value)
        return value


class EngineOverrides(_Strict):
    """Engine settings a person may pin; the GPU budget still checks that they fit. Bounds are
    the engine-argument table's (gpu_budget/engine_args.py)."""

    gpu_memory_utilization: float | None = Field(
        None, gt=ENGINE_ARG["gpu_memory_utilization"].minimum,
        le=ENGINE_ARG["gpu_memory_utilization"].maximum,
        description="Unset: the SKU rule (docs/design-decisions.md#gpu-memory-utilization-by-sku).",
    )
    max_num_seqs: int | None = Field(None, ge=1, le=4096)
    max_num_batched_tokens: int | None = Field(None, ge=16, le=131072)
    enable_prefix_caching: bool = Field(True, description="Reuse the system prompt's KV blocks.")
    enforce_eager: bool = Field(False, description="Skip CUDA graphs (slower; frees memory).")
    max_num_queued_reqs: int | None = Field(
        None, ge=1, description="vLLM answers 503 past this queue length (None: unbounded)."
    )


class HealthCheckSettings(_Strict):
    """How long SageMaker waits for a new instance: weight download, then warm-up."""

    model_data_download_timeout_s: int = Field(1200, ge=60, le=3600)
    container_startup_health_check_timeout_s: int = Field(
        1200, ge=60, le=3600,
        description="Until /ping answers 200: engine start, CUDA-graph capture and warm-up.",
    )


TrafficShift = Literal["all_at_once", "canary", "linear"]

GUARDRAILS_EXCLUDED_FAMILIES: frozenset[str] = frozenset({"ml.inf1"})
"""Instance families SageMaker's deployment guardrails exclude: "Endpoints that use Inf1
(Inferentia-based) instances" fall back to "a blue/green deployment with all at once traffic
shifting and no final baking period" (SageMaker Developer Guide, Deployment guardrails,
Exclusions: https://docs.aws.amazon.com/sagemaker/latest/dg/deployment-guardrails-exclusions.html).
Guardrails are traffic shifting, baking and auto-rollback, so none of them applies there."""

DEFAULT_STEP_PERCENT = 10


def guardrails_supported(instance_type: str) -> bool:
    """Whether SageMaker applies deployment guardrails (shifting, baking, rollback) here."""
    return ".".join(instance_type.split(".")[:2]) not in GUARDRAILS_EXCLUDED_FAMILIES


class DeploymentSettings(_Strict):
    """Blue/green updates: how traffic moves to the new fleet, how long alarms watch it.

    ``all_at_once`` shifts everything at once and bakes ``bake_s``; ``canary`` shifts
    ``canary_percent`` of the capacity first and bakes; ``linear`` shifts ``linear_step_percent``
    per step, baking after each. Auto-rollback on the endpoint's rollback alarms applies to all
    three. What SageMaker accepts also depends on the instance type and count, so the endpoint
    settings check it (:func:`deployment_problem`).
    """

    traffic_shift: TrafficShift = Field(
        "canary", description="all_at_once, canary or linear (TrafficRoutingConfig Type)."
    )
    canary_percent: int | None = Field(
        None, ge=1, le=50, description=f"canary only: capacity share of the canary "
        f"(default {DEFAULT_STEP_PERCENT})."
    )
    linear_step_percent: int | None = Field(
        None, ge=10, le=50, description=f"linear only: capacity share per step "
        f"(default {DEFAULT_STEP_PERCENT})."
    )
    bake_s: int = Field(
        600, ge=0, le=3600,
        description="Alarms watch the new fleet this long after each traffic step before the "
        "next one, or before the old fleet goes (WaitIntervalInSeconds).",
    )
    termination_wait_s: int = Field(
        300, ge=0, le=3600, description="Keep the old fleet this long after the full shift."
    )
    maximum_execution_timeout_s: int = Field(3600, ge=600, le=14400)

    @model_validator(mode="after")
    def _sizes_belong_to_their_shift(self) -> DeploymentSettings:
        for field, shift in (("canary_percent", "canary"), ("linear_step_percent", "linear")):
            if getattr(self, field) is not None and self.traffic_shift != shift:
                raise ValueError(
                    f"{field} applies to traffic_shift {shift}, not {self.traffic_shift}"
                )
        return self

    @property
    def step_percent(self) -> int | None:
        """Capacity share of the first (canary) or every (linear) step; None for all-at-once."""
        if self.traffic_shift == "canary":
            return self.canary_percent or DEFAULT_STEP_PERCENT
        if self.traffic_shift == "linear":
            return self.linear_step_percent or DEFAULT_STEP_PERCENT
        return None


def deployment_problem(
    deployment: DeploymentSettings, *, instance_type: str, min_capacity: int
) -> str | None:
    """Why SageMaker would not honour ``deployment`` on this variant, or None.

    * Inf1 is excluded from deployment guardrails (:data:`GUARDRAILS_EXCLUDED_FAMILIES`): only
      all-at-once without a bake describes what happens there.
    * TrafficRoutingConfig: "CanarySize ... Value must be less than or equal to 50% of the
      variant's total instance count", "LinearStepSize ... Value must be 10-50% of the variant's
      total instance count" (SageMaker API Reference, TrafficRoutingConfig:
      https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_TrafficRoutingConfig.html).
      A step is whole instances, at least one, so the check is made at the variant's smallest
      size, ``min_capacity``: a one-instance variant cannot run a canary at all.
    """
    shift = deployment.traffic_shift
    if not guardrails_supported(instance_type):
        if shift != "all_at_once":
            return (
                f"deployment.traffic_shift: {shift!r} is not honoured on {instance_type}: "
                "SageMaker deployment guardrails exclude Inf1 instances, which fall back to "
                "all-at-once with no baking period (set traffic_shift: all_at_once, bake_s: 0)"
            )
        if deployment.bake_s:
            return (
                f"deployment.bake_s: {deployment.bake_s} is not honoured on {instance_type}: "
                "SageMaker deployment guardrails exclude Inf1 instances (no baking period); "
                "set bake_s: 0"
            )
        return None
    percent = deployment.step_percent
    if percent is None:
        return None
    step_instances = max(1, math.ceil(percent * min_capacity / 100))
    if 2 * step_instances > min_capacity:
        field = "canary_percent" if shift == "canary" else "linear_step_percent"
        return (
            f"deployment.{field}: {percent} % of min_capacity {min_capacity} is a {shift} step "
            f"of {step_instances} instance(s), more than 50 % of the variant's instance count "
            f"(SageMaker TrafficRoutingConfig); use traffic_shift: all_at_once or raise "
            "scaling.min_capacity"
        )
    return None


class ContextWindowSettings(_Strict):
    """Shares of ``max_model_len`` the gateway gives each part of a prompt, and the default
    ``max_tokens`` (``GATEWAY_CONTEXT_SPLIT``). Seed 001: 512 system + 1,024 retrieved context +
    2,048 history + 512 output of a 4,096 window."""

    system: float = Field(0.125, ge=0, le=1)
    rag: float = Field(0.25, ge=0, le=1)
    history: float = Field(0.5, gt=0, le=1)
    output: float = Field(0.125, gt=0, le=1)
    step_turns: int = Field(
        6, ge=1, le=1000,
        description="Turns of the conversation's average size each step of the sliding window "
        "makes room for (GATEWAY_CONTEXT_STEP_TURNS; docs/design-decisions.md"
        "#prefix-stable-window).")

    @model_validator(mode="after")
    def _within_the_window(self) -> ContextWindowSettings:
        total = self.system + self.rag + self.history + self.output
        if total > 1 + 1e-9:
            raise ValueError(f"shares add up to {total:g}; accepted: at most 1")
        return self


class BucketDemandSettings(_Strict):
    """The typical request of one bucket and its share of all requests."""

    share: float = Field(ge=0, le=1)
    prompt_tokens: int = Field(ge=1)
    max_tokens: int = Field(ge=1)
    output_tokens: int = Field(ge=1, description="Tokens generated, on average.")
    system_tokens: int = Field(
        0, ge=0, description="Of the prompt: the product's system prompt (always cached).")
    history_tokens: int = Field(
        0, ge=0, description="Of the prompt: earlier turns of the conversation (cached as far "
        "as the window, sessions and eviction allow; docs/capacity.md).")


class ConversationSettings(_Strict):
    """The long conversation the requirements ask 60 of per GPU
    (docs/design-decisions.md#conversations-per-gpu)."""

    turns: int = Field(30, ge=1, le=1000)
    tokens_per_turn: int = Field(
        100, ge=1,
        description="~100 tokens a turn (docs/design-decisions.md#conversations-per-gpu).")
    system_tokens: int = Field(512, ge=0)
    rag_tokens: int = Field(1024, ge=0)
    rag_chunks: int = Field(4, ge=1, description="Retrieved chunks (the gateway keeps whole ones).")
    concurrent_wanted: int = Field(60, ge=1, description="Seed 001 story 1: >= 60 per GPU.")
    think_time_s: float = Field(
        45, gt=0, le=3600,
        description="Mean time from the end of an answer to the customer's next message: how "
        "long a conversation's cached prefix must survive (docs/capacity.md).")


class RateChoiceSettings(_Strict):
    """Which end of the GPU's rate ranges the fleet is sized at (config/decode_speed.json
    ``rates``). Every environment sizes at ``central``; the cost report prices the others."""

    scenario: Literal["pessimistic", "central", "optimistic"] = "central"
    prefill_factor: float = Field(
        1.0, gt=0, le=10,
        description="Multiplies the scenario's prefill rate (the cost report's sensitivity).")


class LlmCapacitySettings(_Strict):
    """Inputs of the capacity model for the LLM endpoint (none of them a capacity figure)."""

    decode_speed_file: RepoRelativePath = Field(
        "config/decode_speed.json",
        description="The decode-speed table: TTFT and TPOT by batch size per GPU and model.",
    )
    request_mix: dict[Literal["S", "M", "L", "XL"], BucketDemandSettings] = Field(
        description="Share and typical request of each request-size bucket (request_buckets)."
    )
    admission_watermark: float = Field(
        0.9, gt=0, le=1,
        description="Share of the KV pool one request may be expected to hold at its end "
        "(GATEWAY_ADMISSION_WATERMARK; more never fits), and the share the capacity model sizes "
        "the bucket caps and the KV limit within (each request at prompt + max_tokens).",
    )
    conversation: ConversationSettings = Field(default_factory=ConversationSettings)
    rates: RateChoiceSettings = Field(default_factory=RateChoiceSettings)
    sessions: bool = Field(
        True, description="The gateway pins a conversation's turns to one instance with "
        "SageMaker stateful sessions (its prefix cache stays useful); False: every request is "
        "routed by least outstanding requests.")

    @field_validator("decode_speed_file")
    @classmethod
    def _exists(cls, value: str) -> str:
        if not (REPO_ROOT / value).is_file():
            raise ValueError("no such file")
        return value


class DeclaredCapacitySettings(_Strict):
    """What one instance of an endpoint the GPU budget does not size (the classifier) serves."""

    per_instance_invocations_per_min: float = Field(gt=0)
    source: str = Field(min_length=1, description="Where the figure comes from.")


class LlmEndpointSettings(_Strict):
    """The vLLM endpoint: model, instance, context window, adapters, health and deployment."""

    instance_type: str = Field("ml.g5.xlarge", description="A GPU instance of the catalog.")
    model: BaseModelSettings
    max_model_len: int = Field(4096, ge=256, le=131072)
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    block_size: int = Field(DEFAULT_BLOCK_SIZE,
                            description="Tokens per KV block: one of the engine table's sizes.")
    engine: EngineOverrides = Field(default_factory=EngineOverrides)
    adapters: list[LoraAdapterSettings] = Field(default_factory=list)
    max_loras: int | None = Field(
        None, ge=1, le=64, description="Adapters per batch (default: all of them)."
    )
    routing: dict[str, AdapterName] = Field(
        default_factory=dict,
        description="intent -> adapter name (or 'base') when a request names no model.",
    )
    locale_routes: dict[LocaleTag, dict[AdapterName, AdapterName]] = Field(
        default_factory=dict,
        description="locale -> {adapter picked by intent: adapter to use instead}.",
    )
    health: HealthCheckSettings = Field(default_factory=HealthCheckSettings)
    deployment: DeploymentSettings = Field(default_factory=DeploymentSettings)
    context_window: ContextWindowSettings = Field(default_factory=ContextWindowSettings)
    capacity: LlmCapacitySettings
    scaling: ScalingSettings
    alarms: EndpointAlarmSettings = Field(default_factory=EndpointAlarmSettings)

    @field_validator("block_size")
    @classmethod
    def _engine_block_size(cls, value: int) -> int:
        return _engine_table_choice("block_size", value)

    @field_validator("instance_type")
    @classmethod
    def _gpu_instance(cls, value: str) -> str:
        from gpu_budget import instance_type

        kind = instance_type(value).accelerator_kind
        if kind != "gpu":
            raise ValueError(f"is an {kind} instance; the vLLM endpoint needs a GPU instance")
        return value

    @field_validator("routing")
    @classmethod
    def _known_intents(cls, value: dict[str, str]) -> dict[str, str]:
        from intents import INTENT_LABELS

        unknown = sorted(set(value) - set(INTENT_LABELS))
        if unknown:
            raise ValueError(
                f"unknown intent(s) {', '.join(unknown)}; accepted: {', '.join(INTENT_LABELS)}"
            )
        return value

    @model_validator(mode="after")
    def _adapters_consistent(self) -> LlmEndpointSettings:
        names = [adapter.name for adapter in self.adapters]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"adapters: name {duplicates[0]!r} is used twice")
        reserved = sorted(RESERVED_NAMES & {*names, self.model.served_model_name})
        if reserved:
            raise ValueError(f"adapters: {reserved[0]!r} is reserved (model={reserved[0]!r} "
                             "means something else); accepted: any other name")
        if self.model.served_model_name in names:
            raise ValueError(f"adapters: {self.model.served_model_name!r} is the base model's "
                             "served name; accepted: a name of its own")
        served = {*names, BASE_ROUTE}
        for intent, target in self.routing.items():
            if target not in served:
                raise ValueError(
                    f"routing.{intent}: {target!r} is not a configured adapter; accepted: "
                    f"{', '.join(sorted(served))}"
                )
        for locale, table in self.locale_routes.items():
            for source, target in table.items():
                for name in (source, target):
                    if name not in names:
                        raise ValueError(
                            f"locale_routes.{locale}: {name!r} is not a configured adapter; "
                            f"accepted: {', '.join(sorted(names))}"
                        )
        if self.max_loras is not None and self.max_loras > len(self.adapters):
            raise ValueError(
                f"max_loras: {self.max_loras} is more than the {len(self.adapters)} configured "
                "adapters"
            )
        return self

    @model_validator(mode="after")
    def _deployment_honoured(self) -> LlmEndpointSettings:
        problem = deployment_problem(self.deployment, instance_type=self.instance_type,
                                     min_capacity=self.scaling.min_capacity)
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _fits_the_gpu(self) -> LlmEndpointSettings:
        from gpu_budget import BudgetError

        try:
            self.memory_plan()
        except BudgetError as exc:
            raise ValueError(f"the GPU memory budget refuses this configuration: {exc}") from None
        return self

    @model_validator(mode="after")
    def _capacity_derivable(self) -> LlmEndpointSettings:
        from capacity_model import CapacityError, DecodeTableError, DemandError, FleetError

        try:
            self.capacity_plan()
        except (CapacityError, DecodeTableError, DemandError, FleetError) as exc:
            raise ValueError(f"the capacity model refuses this configuration: {exc}") from None
        return self

    def decode_speed_table(self) -> DecodeSpeedTable:
        """The decode-speed table the capacity model reads."""
        from capacity_model import parse_decode_table

        path = self.capacity.decode_speed_file
        return parse_decode_table((REPO_ROOT / path).read_text(encoding="utf-8"), source=path)

    def capacity_plan(self) -> LlmCapacity:
        """The capacity model's plan for these settings: per-instance capacity and caps, the
        fleet's targets and daily limits, the long-conversation options."""
        from capacity_model import (
            BucketDemand,
            ContextWindow,
            Conversation,
            LatencySlo,
            ReuseInputs,
            llm_capacity,
            request_mix,
        )
        from request_buckets import RequestBucket, bucket_bounds

        memory_plan = self.memory_plan()
        window = ContextWindow(**self.context_window.model_dump())
        mix = request_mix(
            [BucketDemand(RequestBucket(name), d.share, d.prompt_tokens, d.max_tokens,
                          d.output_tokens, d.system_tokens, d.history_tokens)
             for name, d in self.capacity.request_mix.items()],
            bucket_bounds(self.max_model_len),
        )
        conversation = self.capacity.conversation
        return llm_capacity(
            plan=memory_plan,
            replan=self.memory_plan,
            mix=mix,
            window=window,
            table=self.decode_speed_table(),
            slo=LatencySlo(self.alarms.time_to_first_token_p99_ms,
                           self.alarms.time_per_output_token_p99_ms),
            admission_watermark=self.capacity.admission_watermark,
            policy=self.scaling.fleet_policy(),
            profile=self.scaling.traffic.profile(),
            conversation=Conversation(conversation.turns, conversation.tokens_per_turn,
                                      conversation.system_tokens, conversation.rag_tokens,
                                      conversation.rag_chunks),
            conversations_wanted=conversation.concurrent_wanted,
            reuse=ReuseInputs(sessions=self.capacity.sessions,
                              think_time_s=conversation.think_time_s,
                              scenario=self.capacity.rates.scenario,
                              prefill_factor=self.capacity.rates.prefill_factor),
        )

    def fleet_plan(self) -> FleetPlan:
        """The fleet part of :meth:`capacity_plan`."""
        return self.capacity_plan().fleet

    def memory_plan(self, *, kv_cache_dtype: str | None = None,
                    instance: str | None = None) -> MemoryPlan:
        """The GPU budget's plan for these settings (raises BudgetError when it cannot fit);
        ``kv_cache_dtype`` / ``instance`` plan the same settings with another KV-cache dtype or
        instance type (the capacity model's what-ifs)."""
        from gpu_budget import plan

        return plan(
            str(REPO_ROOT / self.model.config),
            quantization=self.model.quantization,
            instance=instance or self.instance_type,
            max_model_len=self.max_model_len,
            kv_cache_dtype=kv_cache_dtype or self.kv_cache_dtype,
            block_size=self.block_size,
            gpu_memory_utilization=self.engine.gpu_memory_utilization,
            max_num_seqs=self.engine.max_num_seqs,
            max_num_batched_tokens=self.engine.max_num_batched_tokens,
            max_loras=self.lora_slots,
            max_lora_rank=self.max_lora_rank,
        )

    @property
    def lora_slots(self) -> int:
        """Adapters vLLM keeps on the GPU at once (max_loras)."""
        return self.max_loras if self.max_loras is not None else len(self.adapters)

    @property
    def max_lora_rank(self) -> int:
        """The largest adapter rank (vLLM sizes every slot for it)."""
        return max((adapter.rank for adapter in self.adapters), default=0)


ArchiveKey = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9!_.*'()/-]*\.tar\.gz$")
]


class IntentEndpointSettings(_Strict):
    """The DistilBERT intent classifier on Inferentia (inf1 by default, inf2 supported)."""

    target: Literal["inf1", "inf2"] = Field(
        "inf1", description="Neuron target the model was compiled for; picks the image's base."
    )
    instance_type: str = Field(
        "ml.inf1.xlarge", description="An Inferentia instance of that target."
    )
    artifact_key: ArchiveKey = Field(
        description="Key of the compiled model.tar.gz (neuron/compile.py) in the artifact bucket."
    )
    model_copies: int | None = Field(
        None, ge=1, le=64, description="Model copies over the NeuronCores (default: one per core)."
    )
    health: HealthCheckSettings = Field(default_factory=HealthCheckSettings)
    capacity: DeclaredCapacitySettings
    deployment: DeploymentSettings = Field(
        # inf1, the default target, is excluded from deployment guardrails: all at once, no bake.
        default_factory=lambda: DeploymentSettings(traffic_shift="all_at_once", bake_s=0)
    )
    scaling: ScalingSettings
    alarms: EndpointAlarmSettings = Field(
        default_factory=lambda: EndpointAlarmSettings(latency_p99_sla_ms=100)
    )

    @field_validator("artifact_key")
    @classmethod
    def _in_a_folder(cls, value: str) -> str:
        if "/" not in value:
            raise ValueError(
                "must lie in a folder (e.g. models/intent/<name>/model.tar.gz): the endpoint's "
                "role may read that folder only"
            )
        return value

    @property
    def artifact_folder(self) -> str:
        """The folder of the archive: what the execution role reads, where its manifest goes."""
        return self.artifact_key.rsplit("/", 1)[0]

    def fleet_plan(self) -> FleetPlan:
        """The classifier's fleet numbers from its declared per-instance rate."""
        from capacity_model import InstanceLoad, fleet_plan

        load = InstanceLoad(
            sustainable_invocations_per_min=self.capacity.per_instance_invocations_per_min,
            concurrency=None, source=self.capacity.source)
        return fleet_plan(load, self.scaling.fleet_policy(), self.scaling.traffic.profile())

    @model_validator(mode="after")
    def _instance_matches_target(self) -> IntentEndpointSettings:
        from gpu_budget import instance_type

        entry = instance_type(self.instance_type)
        if entry.family != f"ml.{self.target}":
            raise ValueError(
                f"instance_type {self.instance_type!r} does not run {self.target} models; "
                f"accepted: ml.{self.target}.* instances"
            )
        if self.model_copies is not None and entry.neuron_cores is not None and (
            self.model_copies > entry.neuron_cores
        ):
            raise ValueError(
                f"model_copies {self.model_copies} exceeds the {entry.neuron_cores} NeuronCores "
                f"of {self.instance_type}"
            )
        return self

    @model_validator(mode="after")
    def _fleet_derivable(self) -> IntentEndpointSettings:
        from capacity_model import FleetError

        if self.scaling.tracks_concurrency:
            raise ValueError(
                f"scaling.target_metric: {self.scaling.target_metric!r} needs a concurrency per "
                "instance, which only the LLM's capacity model derives; accepted: "
                "invocations_per_instance")
        try:
            self.fleet_plan()
        except FleetError as exc:
            raise ValueError(f"the capacity model refuses this configuration: {exc}") from None
        return self

    @model_validator(mode="after")
    def _deployment_honoured(self) -> IntentEndpointSettings:
        problem = deployment_problem(self.deployment, instance_type=self.instance_type,
                                     min_capacity=self.scaling.min_capacity)
        if problem:
            raise ValueError(problem)
        return self


class ReleaseCalendarSettings(_Strict):
    """Where the release calendar is and how its reconciling Lambda runs."""

    file: RepoRelativePath = Field(
        "config/release_calendar.yaml", description="The calendar, relative to the repo root."
    )
    horizon_days: int = Field(14, ge=1, le=90, description="Dated events kept this far ahead.")
    daily_run_utc: LocalTime = Field(
        "15:05", description="When the Lambda reconciles every day, UTC (15:05 = 00:05 JST)."
    )
    log_retention_days: LogRetentionDays = Field(
        365, description="The reconciler's logs. At least a year (AWS Control Tower "
        "CT.CLOUDWATCH.PR.2).")

    @field_validator("file")
    @classmethod
    def _exists(cls, value: str) -> str:
        if not (REPO_ROOT / value).is_file():
            raise ValueError("no such file")
        return value


GitHubRepository = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$")
]
RoleArn = Annotated[
    str, StringConstraints(pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/[A-Za-z0-9+=,.@_-]{1,64}$")
]


class DeliverySettings(_Strict):
    """How the delivery pipeline (GitHub Actions, .github/workflows/) reaches this environment.

    Nothing account-specific is written in the workflows: they ask ``tools.pipeline_settings``
    for these values, so an account or role change is a reviewed config change.
    """

    github_repository: GitHubRepository = Field(
        description="owner/name of the repository whose workflows may assume the role."
    )
    github_environment: Annotated[
        str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$")
    ] = Field(
        description="GitHub environment of the deploy job (required reviewers gate prod); the "
        "role trusts only jobs running in it."
    )
    deploy_role_arn: RoleArn = Field(
        description="Role the pipeline assumes by OIDC (aws-actions/configure-aws-credentials); "
        "docs/delivery.md says how to create it."
    )

    @property
    def deploy_role_name(self) -> str:
        """The role's name (the last part of its ARN)."""
        return self.deploy_role_arn.rsplit("/", 1)[1]


class SmokeSettings(_Strict):
    """What `make smoke` accepts from the live endpoints after a deploy (tools/smoke)."""

    llm_latency_ms: float = Field(
        20000, gt=0, le=60000,
        description="Whole answer of a non-streamed request (SageMaker cuts at 60 s).",
    )
    llm_time_to_first_token_ms: float = Field(
        3000, gt=0, le=60000, description="First content chunk of the streamed request."
    )
    intent_latency_ms: float = Field(
        1000, gt=0, le=60000, description="The intent endpoint's answer to the whole batch."
    )
    max_tokens: int = Field(48, ge=1, le=1024, description="Tokens each LLM request may use.")
    min_intent_agreement: float = Field(
        0.0, ge=0, le=1,
        description="Share of the intent batch that must get its expected label (0 with a "
        "random or uncalibrated model).",
    )


class QuantizationJobSettings(_Strict):
    """The AWQ job as a SageMaker training job (`python -m tools.quantize`)."""

    base_model_root: S3Prefix = Field(
        "base-models",
        description="Prefix in the artifact bucket under which base models are uploaded; the "
        "job's role reads nothing else.",
    )
    candidates_prefix: S3Prefix = Field(
        "quantization/models",
        description="Where each run that passes its gate uploads its model, with its own "
        "artifact-manifest.json: <candidates_prefix>/<run id>/. Never served from there and never "
        "written over the served prefix; `make promote` copies a run's model, checked, to "
        "llm.model.artifact_prefix.",
    )
    reports_prefix: S3Prefix = Field(
        "quantization/runs", description="Every run's quality_gate.md/json, pass or fail."
    )
    instance_type: str = Field(
        "ml.g5.4xlarge",
        description="A GPU training instance (g5.4xlarge: one A10G, 64 GiB host memory for the "
        "bf16 model held on the CPU during calibration).",
    )
    volume_size_gb: int = Field(100, ge=30, le=16384)
    max_runtime_s: int = Field(4 * 3600, ge=600, le=28 * 24 * 3600)

    @field_validator("instance_type")
    @classmethod
    def _gpu_instance(cls, value: str) -> str:
        from gpu_budget import instance_type

        if instance_type(value).accelerator_kind != "gpu":
            raise ValueError("is not a GPU instance; AWQ calibration needs one")
        return value


class EnvironmentSettings(_Strict):
    """Everything that differs between environments. Read by every stack, validated once."""

    name: EnvironmentName = Field(description="Short environment name: dev, prod, ...")
    stage_name: Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Za-z0-9]{1,15}$")] = Field(
        description="CDK Stage id, e.g. Dev or Prod; `cdk deploy \"Prod/*\"` selects it."
    )
    account: AccountId = Field(description="12-digit AWS account id.")
    region: str = Field(description="AWS region, e.g. ap-northeast-1.")
    tags: dict[
        Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9 _.:/=+\-@]{1,128}$")], TagValue
    ] = Field(default_factory=dict, description="Tags applied to every resource.")
    alerts: AlertSettings = Field(default_factory=AlertSettings)
    artifacts: ArtifactBucketSettings = Field(default_factory=ArtifactBucketSettings)
    network: NetworkSettings = Field(default_factory=NetworkSettings)
    release_calendar: ReleaseCalendarSettings = Field(default_factory=ReleaseCalendarSettings)
    llm: LlmEndpointSettings
    intent: IntentEndpointSettings
    delivery: DeliverySettings | None = Field(
        None, description="The delivery pipeline's access (absent: deploy from a laptop only)."
    )
    smoke: SmokeSettings = Field(default_factory=SmokeSettings)
    quantization: QuantizationJobSettings = Field(default_factory=QuantizationJobSettings)

    @field_validator("region")
    @classmethod
    def _known_region(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", value):
            raise ValueError("must look like ap-northeast-1")
        if value not in KNOWN_REGIONS:
            raise ValueError(f"must be one of {', '.join(sorted(KNOWN_REGIONS))}")
        return value

    @model_validator(mode="after")
    def _artifacts_apart(self) -> EnvironmentSettings:
        llm, intent = self.llm.model.artifact_prefix, self.intent.artifact_folder
        if f"{intent}/".startswith(f"{llm}/") or f"{llm}/".startswith(f"{intent}/"):
            raise ValueError(
                f"intent.artifact_key {self.intent.artifact_key!r} and "
                f"llm.model.artifact_prefix {llm!r} overlap: SageMaker copies the LLM's whole "
                "prefix into its model directory, so each endpoint needs its own folder"
            )
        return self

    @model_validator(mode="after")
    def _consistent_prefixes_and_accounts(self) -> EnvironmentSettings:
        if self.delivery is not None:
            role_account = self.delivery.deploy_role_arn.split(":")[4]
            if role_account != self.account:
                raise ValueError(
                    f"delivery.deploy_role_arn: {self.delivery.deploy_role_arn!r} is in account "
                    f"{role_account}; accepted: a role in this environment's account "
                    f"{self.account}"
                )
        return self._quantization_prefixes_apart()

    def _quantization_prefixes_apart(self) -> EnvironmentSettings:
        quant = self.quantization
        served = self.llm.model.artifact_prefix
        intent = self.intent.artifact_key.rsplit("/", 1)[0]
        prefixes = {"quantization.base_model_root": quant.base_model_root,
                    "quantization.candidates_prefix": quant.candidates_prefix,
                    "quantization.reports_prefix": quant.reports_prefix}
        for label, prefix in prefixes.items():
            if _overlaps(prefix, served):
                raise ValueError(
                    f"{label}: {prefix!r} overlaps the model prefix {served!r}; accepted: a "
                    "prefix outside the served model's")
            if _overlaps(prefix, intent):
                raise ValueError(f"{label}: {prefix!r} overlaps the intent model "
                                 f"{self.intent.artifact_key!r}; accepted: a prefix of its own")
        labels = list(prefixes)
        for index, first in enumerate(labels):
            for second in labels[index + 1:]:
                if _overlaps(prefixes[first], prefixes[second]):
                    raise ValueError(f"{second}: {prefixes[second]!r} overlaps {first} "
                                     f"{prefixes[first]!r}")
        return self

    @model_validator(mode="after")
    def _served_models_under_their_prefix(self) -> EnvironmentSettings:
        root = self.artifacts.models_prefix
        served = {"llm.model.artifact_prefix": self.llm.model.artifact_prefix,
                  "intent.artifact_key": self.intent.artifact_key}
        for label, key in served.items():
            if not key.startswith(f"{root}/"):
                raise ValueError(
                    f"{label}: {key!r} is not under artifacts.models_prefix {root!r}, the only "
                    f"prefix the deploy role reads and publishes; accepted: {root}/<name>")
        quant = self.quantization
        for label, prefix in {"quantization.base_model_root": quant.base_model_root,
                              "quantization.candidates_prefix": quant.candidates_prefix,
                              "quantization.reports_prefix": quant.reports_prefix}.items():
            if _overlaps(prefix, root):
                raise ValueError(
                    f"{label}: {prefix!r} overlaps artifacts.models_prefix {root!r}, where the "
                    "deploy role reads and writes; accepted: a prefix outside it")
        return self

    @property
    def resource_prefix(self) -> str:
        """Prefix for physical names that must be stable per environment."""
        return f"manga-assist-{self.name}"

    @property
    def foundation_stack_name(self) -> str:
        """CloudFormation name of the Foundation stack (key, bucket, topic): Prod-Foundation."""
        return f"{self.stage_name}-{FOUNDATION_STACK_ID}"

    @property
    def serving_stack_name(self) -> str:
        """CloudFormation name of the Serving stack, e.g. Prod-Serving."""
        return f"{self.stage_name}-{SERVING_STACK_ID}"

    @property
    def alarm_name_prefix(self) -> str:
        """Every alarm of the environment is named with this prefix (the alarm topic's policy
        lets CloudWatch publish for exactly these alarms)."""
        return f"{self.resource_prefix}-"

    @property
    def artifact_bucket_name(self) -> str:
        """The model-artifact bucket's name: fixed, so the serving stack needs no export."""
        return f"{self.resource_prefix}-models-{self.account}-{self.region}"


def _overlaps(first: str, second: str) -> bool:
    """Whether one S3 prefix (a folder, no trailing slash) contains the other."""
    a, b = f"{first}/", f"{second}/"
    return a.startswith(b) or b.startswith(a)


# --- loading and error reporting -------------------------------------------------------------


def _describe_location(model: type[BaseModel], loc: Sequence[int | str]) -> str:
    """Render a pydantic error location as a dotted field path: ``llm.adapters[1].rank``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(top level)"


def _accepted_keys(model: type[BaseModel], loc: Sequence[int | str]) -> list[str] | None:
    """The field names accepted at ``loc``'s parent, for 'unknown key' messages."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        current = _model_in_annotation(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(current.model_fields)
    return None


def _model_in_annotation(annotation: Any) -> Any:
    """Find a BaseModel class inside ``list[Model]``, ``Model | None`` and similar annotations."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in_annotation(arg)
        if found is not None:
            return found
    return None


def _format_error(source: str, model: type[BaseModel], error: ErrorDetails) -> str:
    location = _describe_location(model, error["loc"])
    if error["type"] == "extra_forbidden":
        accepted = _accepted_keys(model, error["loc"])
        hint = f"; accepted keys here: {', '.join(accepted)}" if accepted else ""
        return f"{source}: {location}: unknown key (typo?){hint}"
    if error["type"] == "missing":
        return f"{source}: {location}: required field is missing"
    message = error["msg"].removeprefix("Value error, ")
    if isinstance(error["input"], dict | list):  # a whole section: its repr would drown the message
        return f"{source}: {location}: {message}"
    return f"{source}: {location}: {error['input']!r} is not accepted: {message}"


def format_validation_error(source: str, model: type[BaseModel], exc: ValidationError) -> str:
    """One line per problem: file, field path, value, what is accepted."""
    return "\n".join(_format_error(source, model, error) for error in exc.errors())


def parse_settings(data: Mapping[str, Any], *, source: str) -> EnvironmentSettings:
    """Validate an already-parsed mapping; ``source`` names it in errors (usually the file)."""
    try:
        return EnvironmentSettings.model_validate(dict(data))
    except ValidationError as exc:
        raise SettingsError(format_validation_error(source, EnvironmentSettings, exc)) from None


def load_settings(name: str, *, config_dir: Path = CONFIG_DIR) -> EnvironmentSettings:
    """Load and validate ``config/<name>.yaml``."""
    path = config_dir / f"{name}.yaml"
    source = _display_path(path)
    if not path.is_file():
        available = available_environments(config_dir)
        raise SettingsError(
            f"{source}: no such environment file; available environments: {', '.join(available)}"
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SettingsError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{source}: must be a mapping of settings, got {type(data).__name__}")
    settings = parse_settings(data, source=source)
    if settings.name != name:
        raise SettingsError(
            f"{source}: name: {settings.name!r} is not accepted: must equal the file name {name!r}"
        )
    return settings


def available_environments(config_dir: Path = CONFIG_DIR) -> list[str]:
    """The environments ``config_dir`` defines: every ``<name>.yaml`` but the release calendar."""
    return sorted(p.stem for p in config_dir.glob("*.yaml") if p.stem != "release_calendar")


def load_environments(
    names: Sequence[str] = DEFAULT_ENVIRONMENTS, *, config_dir: Path = CONFIG_DIR
) -> list[EnvironmentSettings]:
    """Load several environments, reporting every broken file at once."""
    loaded: list[EnvironmentSettings] = []
    problems: list[str] = []
    for name in names:
        try:
            loaded.append(load_settings(name, config_dir=config_dir))
        except SettingsError as exc:
            problems.append(str(exc))
    if problems:
        raise SettingsError("\n".join(problems))
    stage_names = [s.stage_name for s in loaded]
    duplicates = sorted({n for n in stage_names if stage_names.count(n) > 1})
    if duplicates:
        raise SettingsError(f"stage_name {duplicates[0]!r} is used by more than one environment")
    return loaded


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)
