"""Application Auto Scaling of one SageMaker endpoint variant, usable by either endpoint.

Three layers (seed 001, stories 3, 4 and 7), all acting on the variant's instance count:

* **target tracking** on InvocationsPerInstance (or the high-resolution ConcurrentRequestsPerModel)
  — scale out fast (60 s cooldown), scale in slowly (600 s);
* **step scaling** from a 1-minute InvocationsPerInstance alarm — +2/+4/+8 instances by how far
  past the threshold, for spikes target tracking reacts to too slowly;
* **scheduled actions** in the settings' time zone — the daily off-peak and business-hours floors
  and the release calendar's pre-scale/restore pairs — which only move MinCapacity/MaxCapacity;
  the policies keep working inside the range and the largest capacity wins.
"""

from __future__ import annotations

from collections.abc import Sequence

import aws_cdk as cdk
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct, IConstruct

import metrics_contract as mc
from release_calendar import MAX_ACTIONS_PER_TARGET, ScheduledCapacity
from stacks.alarms import contract_metric
from stacks.settings import ScalingSettings

SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"


def variant_resource_id(endpoint_name: str, variant_name: str) -> str:
    """Application Auto Scaling's id of a variant: both the endpoint and the variant name."""
    return f"endpoint/{endpoint_name}/variant/{variant_name}"


def step_intervals(settings: ScalingSettings) -> list[appscaling.ScalingInterval]:
    """The step policy's intervals in absolute invocations/min/instance.

    Below the threshold the change is 0: CDK then creates only the upper (scale-out) alarm and
    leaves scale-in to target tracking, which is slower on purpose.
    """
    steps = settings.step_scaling
    if steps is None:
        return []
    threshold = steps.threshold_invocations_per_instance_per_min
    intervals = [appscaling.ScalingInterval(upper=threshold, change=0)]
    for band in steps.bands:
        intervals.append(
            appscaling.ScalingInterval(
                lower=threshold + band.lower,
                upper=None if band.upper is None else threshold + band.upper,
                change=band.add_instances,
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
        scheduled_actions: Sequence[ScheduledCapacity],
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
            "Target",
            service_namespace=appscaling.ServiceNamespace.SAGEMAKER,
            resource_id=self.resource_id,
            scalable_dimension=SCALABLE_DIMENSION,
            min_capacity=settings.min_capacity,
            max_capacity=settings.max_capacity,
        )
        # The variant must exist before Application Auto Scaling can register it.
        self.scalable_target.node.add_dependency(endpoint)

        if settings.target_metric == "invocations_per_instance":
            predefined = appscaling.PredefinedMetric.SAGEMAKER_VARIANT_INVOCATIONS_PER_INSTANCE
            target_value = settings.target_invocations_per_instance_per_min
        else:
            predefined = (
                appscaling.PredefinedMetric.SAGEMAKER_VARIANT_CONCURRENT_REQUESTS_PER_MODEL_HIGH_RESOLUTION
            )
            target_value = settings.target_concurrent_requests_per_model
        self.target_tracking_policy = self.scalable_target.scale_to_track_metric(
            "TargetTracking",
            target_value=target_value,
            predefined_metric=predefined,
            scale_out_cooldown=cdk.Duration.seconds(settings.scale_out_cooldown_s),
            scale_in_cooldown=cdk.Duration.seconds(settings.scale_in_cooldown_s),
        )

        self.step_scaling_policy: appscaling.StepScalingPolicy | None = None
        if settings.step_scaling is not None:
            self.step_scaling_policy = self.scalable_target.scale_on_metric(
                "StepScaleOut",
                metric=contract_metric(
                    mc.SM_INVOCATIONS_PER_INSTANCE,
                    {"EndpointName": endpoint_name, "VariantName": variant_name},
                    statistic="Sum",
                    period=cdk.Duration.minutes(1),
                ),
                scaling_steps=step_intervals(settings),
                adjustment_type=appscaling.AdjustmentType.CHANGE_IN_CAPACITY,
                cooldown=cdk.Duration.seconds(settings.step_scaling.cooldown_s),
                evaluation_periods=1,
                datapoints_to_alarm=1,
                metric_aggregation_type=appscaling.MetricAggregationType.MAXIMUM,
            )

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
        self.scheduled_actions = tuple(scheduled_actions)

    @property
    def step_alarm(self) -> cloudwatch.IAlarm | None:
        """The 1-minute alarm that drives step scaling (None without step scaling)."""
        if self.step_scaling_policy is None:
            return None
        return self.step_scaling_policy.upper_alarm
