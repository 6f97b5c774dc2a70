"""Read the scaling policies of one SageMaker variant from a synthesized CloudFormation template.

What is read ("as synthesized"): the ``AWS::ApplicationAutoScaling::ScalableTarget`` (its
Min/MaxCapacity, ``ScheduledActions`` and the capacity model's figures the stack writes into its
``Metadata`` — what one instance sustains, at what concurrency, how long a request lasts), the
``AWS::ApplicationAutoScaling::ScalingPolicy``
resources pointing at it (target tracking, and step scaling with the ``AWS::CloudWatch::Alarm``
whose ``AlarmActions`` reference the policy), and — when the stack has the release-calendar
Lambda — its ``CALENDAR_CAPACITY_MODELS`` and ``SCALABLE_TARGET_<TARGET>`` environment
variables, so dated events are expanded exactly as the Lambda would.

Only what the simulator can replay is accepted; anything else (another predefined metric, a
metric-math alarm, ``rate()`` schedules) is refused with a message naming the resource.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from release_calendar import CapacityModel, Schedule, capacity_models_from_json, parse_schedule

INVOCATIONS_PER_INSTANCE = "SageMakerVariantInvocationsPerInstance"
CONCURRENCY_HIGH_RESOLUTION = "SageMakerVariantConcurrentRequestsPerModelHighResolution"
TRACKED_METRICS = (INVOCATIONS_PER_INSTANCE, CONCURRENCY_HIGH_RESOLUTION)
CAPACITY_METADATA_KEY = "MangaAssist::Capacity"
"""Where stacks/variant_scaling.py writes the capacity model's figures on the scalable target."""
SUPPORTED_ALARM_METRIC = ("AWS/SageMaker", "InvocationsPerInstance")
_COMPARISONS = ("GreaterThanOrEqualToThreshold", "GreaterThanThreshold", "LessThanThreshold",
                "LessThanOrEqualToThreshold")


class TemplateError(ValueError):
    """The template has no usable scaling setup; the message names the resource."""


@dataclass(frozen=True)
class ScheduledAction:
    """One scheduled action, replayable."""

    name: str
    schedule: Schedule
    timezone: str
    min_capacity: int | None
    max_capacity: int | None
    start_time: dt.datetime | None = None
    end_time: dt.datetime | None = None


@dataclass(frozen=True)
class TargetTrackingPolicy:
    """Target tracking on invocations per instance, or on the high-resolution concurrency."""

    name: str
    target_value: float
    scale_out_cooldown_s: int
    scale_in_cooldown_s: int
    disable_scale_in: bool
    metric: str = INVOCATIONS_PER_INSTANCE


@dataclass(frozen=True)
class InstanceCapacity:
    """The capacity model's per-instance figures, as the template's metadata carries them."""

    invocations_per_min: float
    concurrency: float | None = None
    request_seconds: float | None = None
    headroom: float | None = None
    source: str = ""


@dataclass(frozen=True)
class StepAdjustment:
    """One band: metric − threshold in [lower, upper) → adjust by ``adjustment``."""

    lower: float | None
    upper: float | None
    adjustment: int

    def contains(self, delta: float) -> bool:
        """Whether ``delta`` (metric minus threshold) falls in this band."""
        return ((self.lower is None or delta >= self.lower)
                and (self.upper is None or delta < self.upper))


@dataclass(frozen=True)
class MetricAlarm:
    """The CloudWatch alarm that drives a step policy."""

    name: str
    statistic: str
    period_s: int
    evaluation_periods: int
    datapoints_to_alarm: int
    threshold: float
    comparison: str

    def breaches(self, value: float) -> bool:
        """Whether one datapoint is past the threshold."""
        return {
            "GreaterThanOrEqualToThreshold": value >= self.threshold,
            "GreaterThanThreshold": value > self.threshold,
            "LessThanThreshold": value < self.threshold,
            "LessThanOrEqualToThreshold": value <= self.threshold,
        }[self.comparison]


@dataclass(frozen=True)
class StepScalingPolicy:
    """Step scaling driven by :class:`MetricAlarm`."""

    name: str
    adjustment_type: str
    cooldown_s: int
    steps: tuple[StepAdjustment, ...]
    alarm: MetricAlarm
    min_adjustment_magnitude: int = 0


@dataclass(frozen=True)
class ScalingSetup:
    """Everything the simulator replays for one scalable target."""

    logical_id: str
    min_capacity: int
    max_capacity: int
    scheduled: tuple[ScheduledAction, ...]
    target_tracking: tuple[TargetTrackingPolicy, ...]
    step: tuple[StepScalingPolicy, ...]
    calendar_target: str | None = None
    capacity_models: Mapping[str, CapacityModel] = field(default_factory=dict)
    capacity: InstanceCapacity | None = None
    """None for a template written without the capacity model (the hand-written fixture)."""
    instance_type: str | None = None
    """The variant's instance type, from the endpoint's configuration (None when not found)."""


def load_template(path: Path) -> dict[str, Any]:
    """Read a JSON template (``cdk synth`` writes JSON)."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise TemplateError(f"{path}: cannot read a JSON CloudFormation template ({error})") \
            from None
    if not isinstance(document, dict) or not isinstance(document.get("Resources"), dict):
        raise TemplateError(f"{path}: no Resources section")
    return document


def scaling_setup(template: Mapping[str, Any], *, scalable_target: str | None = None,
                  calendar_target: str | None = None) -> ScalingSetup:
    """Collect the policies of one scalable target.

    ``scalable_target`` is its logical id; without it, the target the release-calendar Lambda
    names as ``calendar_target`` (default ``llm``) is used, or the only one in the template.
    """
    resources: Mapping[str, Any] = template["Resources"]
    targets = {lid: r for lid, r in resources.items()
               if r.get("Type") == "AWS::ApplicationAutoScaling::ScalableTarget"}
    if not targets:
        raise TemplateError("no AWS::ApplicationAutoScaling::ScalableTarget in the template")
    lambda_env = _calendar_lambda_environment(resources)
    chosen = _chosen_target(targets, lambda_env, scalable_target, calendar_target or "llm")
    props = targets[chosen]["Properties"]
    if props.get("ServiceNamespace") != "sagemaker":
        raise TemplateError(f"{chosen}: ServiceNamespace {props.get('ServiceNamespace')!r}"
                            "; the simulator models SageMaker variants only")
    scheduled = tuple(_scheduled_action(chosen, a) for a in props.get("ScheduledActions", []))
    tracking, steps = _policies(resources, chosen)
    models: dict[str, CapacityModel] = {}
    if "CALENDAR_CAPACITY_MODELS" in lambda_env:
        models = capacity_models_from_json(str(lambda_env["CALENDAR_CAPACITY_MODELS"]))
    return ScalingSetup(
        logical_id=chosen, min_capacity=int(props["MinCapacity"]),
        max_capacity=int(props["MaxCapacity"]), scheduled=scheduled,
        target_tracking=tuple(tracking), step=tuple(steps),
        calendar_target=calendar_target or _calendar_target_of(lambda_env, props),
        capacity_models=models, capacity=_capacity(chosen, targets[chosen]),
        instance_type=_instance_type(resources, str(props.get("ResourceId", ""))))


def _chosen_target(targets: Mapping[str, Any], lambda_env: Mapping[str, Any],
                   scalable_target: str | None, calendar_target: str) -> str:
    """The logical id asked for; else the one whose ResourceId the calendar Lambda names for
    ``calendar_target``; else the only one."""
    if scalable_target is None:
        named = lambda_env.get(f"SCALABLE_TARGET_{calendar_target.upper()}")
        matches = [lid for lid, r in targets.items()
                   if named is not None and r["Properties"].get("ResourceId") == named]
        if matches:
            scalable_target = matches[0]
        elif len(targets) == 1:
            scalable_target = next(iter(targets))
        else:
            raise TemplateError(f"{len(targets)} scalable targets ({', '.join(sorted(targets))});"
                                " choose one with --scalable-target")
    if scalable_target not in targets:
        raise TemplateError(f"no scalable target {scalable_target!r}; the template has "
                            f"{', '.join(sorted(targets))}")
    return scalable_target


def _policies(resources: Mapping[str, Any], scalable_target: str
              ) -> tuple[list[TargetTrackingPolicy], list[StepScalingPolicy]]:
    """The scaling policies whose ScalingTargetId references the target, by logical id."""
    tracking: list[TargetTrackingPolicy] = []
    steps: list[StepScalingPolicy] = []
    for lid, resource in sorted(resources.items()):
        if resource.get("Type") != "AWS::ApplicationAutoScaling::ScalingPolicy":
            continue
        policy = resource.get("Properties", {})
        if policy.get("ScalingTargetId") != {"Ref": scalable_target}:
            continue
        if policy.get("PolicyType") == "TargetTrackingScaling":
            tracking.append(_target_tracking(lid, policy))
        elif policy.get("PolicyType") == "StepScaling":
            steps.append(_step_policy(lid, policy, resources))
        else:
            raise TemplateError(f"{lid}: PolicyType {policy.get('PolicyType')!r} is not "
                                "supported; accepted: TargetTrackingScaling, StepScaling")
    return tracking, steps


def _calendar_target_of(lambda_env: Mapping[str, Any], props: Mapping[str, Any]) -> str | None:
    """The calendar target (``llm`` or ``intent``) whose SCALABLE_TARGET_<TARGET> the Lambda
    sets to this target's ResourceId (the last such, as the Lambda reads them)."""
    resolved = None
    for name in ("llm", "intent"):
        if lambda_env.get(f"SCALABLE_TARGET_{name.upper()}") == props.get("ResourceId"):
            resolved = name
    return resolved


def _instance_type(resources: Mapping[str, Any], resource_id: str) -> str | None:
    """The InstanceType of the variant ``endpoint/<name>/variant/<variant>`` names."""
    parts = resource_id.split("/")
    if len(parts) != 4 or parts[0] != "endpoint" or parts[2] != "variant":
        return None
    endpoint_name, variant_name = parts[1], parts[3]
    for resource in resources.values():
        props = resource.get("Properties", {})
        if (resource.get("Type") != "AWS::SageMaker::Endpoint"
                or props.get("EndpointName") != endpoint_name):
            continue
        reference = props.get("EndpointConfigName")
        config_id = (reference.get("Ref") or (reference.get("Fn::GetAtt") or [None])[0]
                     if isinstance(reference, dict) else None)
        config = resources.get(str(config_id), {}).get("Properties", {})
        for variant in config.get("ProductionVariants", []):
            if variant.get("VariantName") == variant_name and "InstanceType" in variant:
                return str(variant["InstanceType"])
    return None


def _capacity(logical_id: str, resource: Mapping[str, Any]) -> InstanceCapacity | None:
    data = (resource.get("Metadata") or {}).get(CAPACITY_METADATA_KEY)
    if data is None:
        return None
    try:
        return InstanceCapacity(
            invocations_per_min=float(data["per_instance_invocations_per_min"]),
            concurrency=_optional_float(data.get("concurrency_per_instance")),
            request_seconds=_optional_float(data.get("request_seconds")),
            headroom=_optional_float(data.get("headroom")),
            source=str(data.get("source", "")))
    except (KeyError, TypeError, ValueError) as error:
        raise TemplateError(f"{logical_id}: Metadata {CAPACITY_METADATA_KEY} is not readable "
                            f"({error!r}); accepted: the object stacks/variant_scaling.py "
                            "writes") from None


def _calendar_lambda_environment(resources: Mapping[str, Any]) -> dict[str, Any]:
    for resource in resources.values():
        if resource.get("Type") != "AWS::Lambda::Function":
            continue
        variables = (resource.get("Properties", {}).get("Environment") or {}).get(
            "Variables") or {}
        if "CALENDAR_CAPACITY_MODELS" in variables:
            return dict(variables)
    return {}


def _scheduled_action(target: str, data: Mapping[str, Any]) -> ScheduledAction:
    name = str(data.get("ScheduledActionName", "?"))
    try:
        schedule = parse_schedule(str(data["Schedule"]))
    except (KeyError, ValueError) as error:
        raise TemplateError(f"{target} scheduled action {name}: {error}") from None
    action = data.get("ScalableTargetAction") or {}
    return ScheduledAction(
        name=name, schedule=schedule, timezone=str(data.get("Timezone") or "UTC"),
        min_capacity=action.get("MinCapacity"), max_capacity=action.get("MaxCapacity"),
        start_time=_utc(data.get("StartTime")), end_time=_utc(data.get("EndTime")))


def _utc(value: object) -> dt.datetime | None:
    if value is None:
        return None
    moment = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def _target_tracking(lid: str, policy: Mapping[str, Any]) -> TargetTrackingPolicy:
    config = policy.get("TargetTrackingScalingPolicyConfiguration") or {}
    metric = (config.get("PredefinedMetricSpecification") or {}).get("PredefinedMetricType")
    if metric not in TRACKED_METRICS:
        raise TemplateError(f"{lid}: target tracking on {metric or 'a custom metric'!r} is not "
                            f"modelled; accepted: {', '.join(TRACKED_METRICS)}")
    return TargetTrackingPolicy(
        name=lid, target_value=float(config["TargetValue"]),
        scale_out_cooldown_s=int(config.get("ScaleOutCooldown", 300)),
        scale_in_cooldown_s=int(config.get("ScaleInCooldown", 300)),
        disable_scale_in=bool(config.get("DisableScaleIn", False)), metric=str(metric))


def _step_policy(lid: str, policy: Mapping[str, Any],
                 resources: Mapping[str, Any]) -> StepScalingPolicy:
    config = policy.get("StepScalingPolicyConfiguration") or {}
    alarms = [(alarm_id, r["Properties"]) for alarm_id, r in resources.items()
              if r.get("Type") == "AWS::CloudWatch::Alarm"
              and {"Ref": lid} in r.get("Properties", {}).get("AlarmActions", [])]
    if len(alarms) != 1:
        raise TemplateError(f"{lid}: step scaling needs exactly one alarm whose AlarmActions "
                            f"reference it, found {len(alarms)}")
    alarm_id, alarm = alarms[0]
    if (alarm.get("Namespace"), alarm.get("MetricName")) != SUPPORTED_ALARM_METRIC:
        raise TemplateError(f"{alarm_id}: alarm on {alarm.get('Namespace')}/"
                            f"{alarm.get('MetricName')} is not modelled; accepted: "
                            f"{'/'.join(SUPPORTED_ALARM_METRIC)} (no metric math)")
    period = int(alarm.get("Period", 60))
    if period % 60:
        raise TemplateError(f"{alarm_id}: Period {period}; accepted: a multiple of 60 s")
    comparison = str(alarm.get("ComparisonOperator"))
    if comparison not in _COMPARISONS:
        raise TemplateError(f"{alarm_id}: ComparisonOperator {comparison!r}; accepted: "
                            f"{', '.join(_COMPARISONS)}")
    statistic = str(alarm.get("Statistic", "Average"))
    if statistic not in ("Sum", "Average", "Maximum", "Minimum"):
        raise TemplateError(f"{alarm_id}: Statistic {statistic!r}; accepted: Sum, Average, "
                            "Maximum, Minimum")
    evaluation = int(alarm.get("EvaluationPeriods", 1))
    adjustment_type = str(config.get("AdjustmentType", "ChangeInCapacity"))
    if adjustment_type not in ("ChangeInCapacity", "ExactCapacity", "PercentChangeInCapacity"):
        raise TemplateError(f"{lid}: AdjustmentType {adjustment_type!r} is not supported")
    steps = tuple(StepAdjustment(
        lower=_optional_float(step.get("MetricIntervalLowerBound")),
        upper=_optional_float(step.get("MetricIntervalUpperBound")),
        adjustment=int(step["ScalingAdjustment"])) for step in config.get("StepAdjustments", []))
    if not steps:
        raise TemplateError(f"{lid}: no StepAdjustments")
    return StepScalingPolicy(
        name=lid, adjustment_type=adjustment_type, cooldown_s=int(config.get("Cooldown", 300)),
        steps=steps, min_adjustment_magnitude=int(config.get("MinAdjustmentMagnitude", 0)),
        alarm=MetricAlarm(name=alarm_id, statistic=statistic, period_s=period,
                          evaluation_periods=evaluation,
                          datapoints_to_alarm=int(alarm.get("DatapointsToAlarm", evaluation)),
                          threshold=float(alarm["Threshold"]), comparison=comparison))


def _optional_float(value: object) -> float | None:
    return None if value is None else float(str(value))
