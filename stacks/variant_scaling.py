"""Application Auto Scaling of one SageMaker endpoint variant, usable by either endpoint.

Three layers, all acting on the variant's instance count (docs/design-decisions.md#target-tracking,
docs/design-decisions.md#off-peak-floors, docs/design-decisions.md#release-calendar,
docs/design-decisions.md#step-scaling):

* **target tracking** on InvocationsPerInstance and/or the high-resolution
  ConcurrentRequestsPerModel — scale out fast (60 s cooldown), scale in slowly (600 s);
* **step scaling** from a 1-minute InvocationsPerInstance alarm — +2/+4/+8 instances by how far
  past the threshold, for spikes target tracking reacts to too slowly;
* **scheduled actions** in the settings' time zone — the daily off-peak and business-hours floors
  and the release calendar's pre-scale/restore pairs — which only move MinCapacity/MaxCapacity;
  the policies keep working inside the range and the largest capacity wins.

Every number in them — the targets, the step threshold and bands, the daily minima and maxima,
the calendar's capacities — is the capacity model's (:class:`capacity_model.FleetPlan`); the
settings only shape the policies. The figures the simulator and the cost report need are written
into the scalable target's template metadata (:data:`CAPACITY_METADATA_KEY`), so they read the
template and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct, IConstruct

import metrics_contract as mc
from capacity_model import FleetPlan
from release_calendar import MAX_ACTIONS_PER_TARGET, ScheduledCapacity
from stacks.alarms import contract_metric
from stacks.settings import ScalingSettings

SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
CAPACITY_METADATA_KEY = "MangaAssist::Capacity"
"""Template metadata of each scalable target: the capacity model's per-instance figures."""


FIRST_DEPLOYED_INSTANCE_TYPES = frozenset({"ml.g5.xlarge", "ml.inf1.xlarge"})
"""The instance types the variants were first deployed with: their scalable targets keep the
construct id ``Target`` they had (renaming a deployed target would make CloudFormation delete the
old one, which deregisters the variant it just registered again)."""


def scalable_target_id(instance_type: str) -> str:
    """The scalable target's construct id: one per instance type of the variant.

    SageMaker refuses to change the instance type of a variant registered with Application Auto
    Scaling ("If the update would change the instance type for any model that is a target for
    auto scaling, the update fails", "Update endpoints that use auto scaling"). So an
    instance-type change (``intent.target`` inf1 -> inf2) gets a new scalable target, created
    after the endpoint update; the old one is retained (DeletionPolicy Retain), never deleted by
    CloudFormation, because ``tools/instance_switch.py`` deregistered it before the deploy and
    deleting it afterwards would deregister the new registration of the same variant.
    """
    if instance_type in FIRST_DEPLOYED_INSTANCE_TYPES:
        return "Target"
    return "Target" + "".join(part.capitalize() for part in instance_type.split("."))


def variant_resource_id(endpoint_name: str, variant_name: str) -> str:
    """Application Auto Scaling's id of a variant: both the endpoint and the variant name."""
    return f"endpoint/{endpoint_name}/variant/{variant_name}"


def step_intervals(fleet: FleetPlan) -> list[appscaling.ScalingInterval]:
    """The step policy's intervals in absolute invocations/min/instance (the capacity model's
    threshold and bands).

    Below the threshold the change is 0: CDK then creates only the upper (scale-out) alarm and
    leaves scale-in to target tracking, which is slower on purpose.
    """
    threshold = fleet.step_threshold_invocations_per_instance_per_min
    if threshold is None:
        return []
    intervals = [appscaling.ScalingInterval(upper=threshold, change=0)]
    for lower, upper, add in fleet.step_intervals:
        intervals.append(
            appscaling.ScalingInterval(
                lower=threshold + lower,
                upper=None if upper is None else threshold + upper,
                change=add,
            )
        )
    return intervals


class VariantScaling(Construct):
    """The scalable target of one variant with its policies and scheduled actions."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        endpoint: IConstruct,
        endpoint_name: str,
        variant_name: str,
        settings: ScalingSettings,
        fleet: FleetPlan,
        scheduled_actions: Sequence[ScheduledCapacity],
        capacity_metadata: Mapping[str, Any],
        instance_type: str,
    ) -> None:
        super().__init__(scope, id_)
        if len(scheduled_actions) > MAX_ACTIONS_PER_TARGET:
            raise ValueError(
                f"{endpoint_name}: {len(scheduled_actions)} scheduled actions; Application Auto "
                f"Scaling allows {MAX_ACTIONS_PER_TARGET} per scalable target"
            )
        self.resource_id = variant_resource_id(endpoint_name, variant_name)
        self.scalable_target = appscaling.ScalableTarget(
            self,
            scalable_target_id(instance_type),
            service_namespace=appscaling.ServiceNamespace.SAGEMAKER,
            resource_id=self.resource_id,
            scalable_dimension=SCALABLE_DIMENSION,
            min_capacity=settings.min_capacity,
            max_capacity=settings.max_capacity,
        )
        # The variant must exist before Application Auto Scaling can register it.
        self.scalable_target.node.add_dependency(endpoint)
        cfn_target = self.scalable_target.node.default_child
        assert isinstance(cfn_target, cdk.CfnResource)
        cfn_target.add_metadata(CAPACITY_METADATA_KEY, dict(capacity_metadata))
        # Never deregistered by CloudFormation: a stack deletion deletes the endpoint, and
        # "Application Auto Scaling deregisters those models as scalable targets" then ("Delete
        # endpoints configured for auto scaling"); an instance-type change deregisters it first
        # (scalable_target_id says why).
        cfn_target.apply_removal_policy(cdk.RemovalPolicy.RETAIN)

        self.target_tracking_policies = self._target_tracking(endpoint_name, settings, fleet)
        self.step_scaling_policy = self._step_scaling(endpoint_name, variant_name, settings,
                                                      fleet)
        self._schedule(settings, scheduled_actions)
        self.scheduled_actions = tuple(scheduled_actions)

    def _target_tracking(self, endpoint_name: str, settings: ScalingSettings, fleet: FleetPlan
                         ) -> list[appscaling.TargetTrackingScalingPolicy]:
        """Target tracking on invocations per instance and/or the high-resolution concurrency,
        at the capacity model's targets."""
        policies: list[appscaling.TargetTrackingScalingPolicy] = []
        if settings.tracks_invocations:
            policies.append(self.scalable_target.scale_to_track_metric(
                "TargetTracking",
                target_value=fleet.target_invocations_per_instance_per_min,
                predefined_metric=(
                    appscaling.PredefinedMetric.SAGEMAKER_VARIANT_INVOCATIONS_PER_INSTANCE),
                scale_out_cooldown=cdk.Duration.seconds(settings.scale_out_cooldown_s),
                scale_in_cooldown=cdk.Duration.seconds(settings.scale_in_cooldown_s),
            ))
        if settings.tracks_concurrency:
            if fleet.target_concurrent_requests_per_model is None:
                raise ValueError(f"{endpoint_name}: high-resolution target tracking needs the "
                                 "capacity model's concurrency per instance")
            policies.append(self.scalable_target.scale_to_track_metric(
                "ConcurrencyTracking",
                target_value=fleet.target_concurrent_requests_per_model,
                predefined_metric=appscaling.PredefinedMetric.SAGEMAKER_VARIANT_CONCURRENT_REQUESTS_PER_MODEL_HIGH_RESOLUTION,
                scale_out_cooldown=cdk.Duration.seconds(settings.scale_out_cooldown_s),
                scale_in_cooldown=cdk.Duration.seconds(settings.scale_in_cooldown_s),
            ))
        return policies

    def _step_scaling(self, endpoint_name: str, variant_name: str, settings: ScalingSettings,
                      fleet: FleetPlan) -> appscaling.StepScalingPolicy | None:
        """Step scale-out from a 1-minute invocations alarm (None without step scaling)."""
        if settings.step_scaling is None:
            return None
        return self.scalable_target.scale_on_metric(
            "StepScaleOut",
            metric=contract_metric(
                mc.SM_INVOCATIONS_PER_INSTANCE,
                {"EndpointName": endpoint_name, "VariantName": variant_name},
                statistic="Sum",
                period=cdk.Duration.minutes(1),
            ),
            scaling_steps=step_intervals(fleet),
            adjustment_type=appscaling.AdjustmentType.CHANGE_IN_CAPACITY,
            cooldown=cdk.Duration.seconds(settings.step_scaling.cooldown_s),
            evaluation_periods=1,
            datapoints_to_alarm=1,
            metric_aggregation_type=appscaling.MetricAggregationType.MAXIMUM,
        )

    def _schedule(self, settings: ScalingSettings,
                  scheduled_actions: Sequence[ScheduledCapacity]) -> None:
        """The daily windows' and the release calendar's scheduled actions."""
        time_zone = cdk.TimeZone.of(settings.time_zone)
        for action in scheduled_actions:
            if action.timezone != settings.time_zone:
                raise ValueError(
                    f"scheduled action {action.name} is in {action.timezone}, the target's "
                    f"schedules in {settings.time_zone}"
                )
            self.scalable_target.scale_on_schedule(
                action.name,
                schedule=appscaling.Schedule.expression(action.schedule),
                time_zone=time_zone,
                min_capacity=action.min_capacity,
                max_capacity=action.max_capacity,
            )

    @property
    def step_alarm(self) -> cloudwatch.IAlarm | None:
        """The 1-minute alarm that drives step scaling (None without step scaling)."""
        if self.step_scaling_policy is None:
            return None
        return self.step_scaling_policy.upper_alarm
