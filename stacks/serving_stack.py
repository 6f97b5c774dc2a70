"""Serving stack: the models' network, both endpoints, their scaling, alarms and calendar.

It only wires constructs together; each construct's module says what it builds and why.
"""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from constructs import Construct

from capacity_model import FleetPlan
from gpu_budget import instance_type
from quantization import job_outputs
from stacks.alarm_rules import (
    INTENT_ROLLBACK_RULES,
    ROLLBACK_RULES,
    intent_alarm_rules,
    llm_alarm_rules,
)
from stacks.alarms import EndpointAlarms
from stacks.artifact_layout import artifact_layout
from stacks.dashboard import DashboardEndpoint, InferenceDashboard
from stacks.intent_endpoint import IntentEndpoint
from stacks.llm_endpoint import LlmEndpoint
from stacks.network import ModelNetwork
from stacks.quantization_job import QuantizationJobResources
from stacks.release_calendar_reconciler import ReleaseCalendarReconciler
from stacks.scaling_limits_publisher import ScalingLimitsPublisher
from stacks.scaling_plan import ScalingTarget, plan_scaling
from stacks.settings import EnvironmentSettings
from stacks.variant_scaling import VariantScaling

VARIANT_NAME = "AllTraffic"


class ServingStack(cdk.Stack):
    """Everything that serves traffic in one environment; replaceable without data loss."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        settings: EnvironmentSettings,
        encryption_key: kms.IKey,
        alarm_topic: sns.ITopic,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            scope,
            id_,
            description=f"MangaAssist GPU inference platform ({settings.name}): endpoints, "
            "scaling, alarms",
            **kwargs,
        )
        self.network = ModelNetwork(
            self,
            "Network",
            cidr=settings.network.cidr,
            availability_zone_count=settings.network.availability_zone_count,
            encryption_key=encryption_key,
            flow_log_retention=getattr(
                logs.RetentionDays, _RETENTION[settings.network.flow_log_retention_days]
            ),
        )
        # Referenced by its fixed name (no cross-stack export to pin the foundation stack).
        artifact_bucket = s3.Bucket.from_bucket_attributes(
            self,
            "ArtifactBucket",
            bucket_name=settings.artifact_bucket_name,
            encryption_key=encryption_key,
        )
        self.network.restrict_s3_endpoint(bucket_arns=[artifact_bucket.bucket_arn])
        layout = artifact_layout(settings)

        quantization = settings.quantization
        self.quantization_job = QuantizationJobResources(
            self,
            "QuantizationJob",
            artifact_bucket=artifact_bucket,
            encryption_key=encryption_key,
            base_model_root=quantization.base_model_root,
            output_prefix=settings.quantized_model_prefix,
            reports_prefix=quantization.reports_prefix,
            network=self.network,
        )
        self.network.allow_s3_writes(object_arns=[
            artifact_bucket.arn_for_objects(f"{prefix}/*")
            for prefix in (settings.quantized_model_prefix, quantization.reports_prefix)
        ])

        llm = settings.llm
        # One capacity plan per endpoint: the gateway's caps, the scaling numbers, the alarms'
        # release-window floor and the template metadata the simulator reads all come from it.
        llm_capacity = llm.capacity_plan()
        llm_fleet = llm_capacity.fleet
        intent_fleet = settings.intent.fleet_plan()
        llm_endpoint_name = f"{settings.resource_prefix}-llm"
        self.llm_alarms = EndpointAlarms(
            self,
            "LlmAlarms",
            endpoint_name=llm_endpoint_name,
            variant_name=VARIANT_NAME,
            rules=llm_alarm_rules(
                llm.alarms,
                gpu_count=instance_type(llm.instance_type).gpu_count,
                max_capacity=llm.scaling.max_capacity,
                daily_minimum=max(floor.min_capacity for floor in llm_fleet.floors),
            ),
            alarm_topic=alarm_topic,
        )
        self.llm_endpoint = LlmEndpoint(
            self,
            "LlmEndpoint",
            settings=llm,
            endpoint_name=llm_endpoint_name,
            variant_name=VARIANT_NAME,
            initial_instance_count=llm.scaling.min_capacity,
            artifact_bucket=artifact_bucket,
            model_artifact=layout.llm,
            encryption_key=encryption_key,
            network=self.network,
            rollback_alarms=self.llm_alarms.by_name(ROLLBACK_RULES),
        )

        intent = settings.intent
        intent_endpoint_name = f"{settings.resource_prefix}-intent"
        self.intent_alarms = EndpointAlarms(
            self,
            "IntentAlarms",
            endpoint_name=intent_endpoint_name,
            variant_name=VARIANT_NAME,
            rules=intent_alarm_rules(intent.alarms, max_capacity=intent.scaling.max_capacity),
            alarm_topic=alarm_topic,
        )
        self.intent_endpoint = IntentEndpoint(
            self,
            "IntentEndpoint",
            settings=intent,
            endpoint_name=intent_endpoint_name,
            variant_name=VARIANT_NAME,
            initial_instance_count=intent.scaling.min_capacity,
            artifact_bucket=artifact_bucket,
            model_artifact=layout.intent,
            encryption_key=encryption_key,
            network=self.network,
            rollback_alarms=self.intent_alarms.by_name(INTENT_ROLLBACK_RULES),
        )

        scaling_targets = {"llm": ScalingTarget(llm.scaling, llm_fleet),
                           "intent": ScalingTarget(intent.scaling, intent_fleet)}
        scaling_plan = plan_scaling(scaling_targets, calendar_file=settings.release_calendar.file)
        for warning in scaling_plan.warnings:
            cdk.Annotations.of(self).add_warning_v2(f"release-calendar:{warning.where}",
                                                    str(warning))
        self.llm_scaling = VariantScaling(
            self,
            "LlmScaling",
            endpoint=self.llm_endpoint.sagemaker_endpoint,
            endpoint_name=llm_endpoint_name,
            variant_name=VARIANT_NAME,
            settings=llm.scaling,
            fleet=llm_fleet,
            scheduled_actions=scaling_plan.actions["llm"],
            capacity_metadata=llm_capacity.template_metadata(),
        )
        self.intent_scaling = VariantScaling(
            self,
            "IntentScaling",
            endpoint=self.intent_endpoint.sagemaker_endpoint,
            endpoint_name=intent_endpoint_name,
            variant_name=VARIANT_NAME,
            settings=intent.scaling,
            fleet=intent_fleet,
            scheduled_actions=scaling_plan.actions["intent"],
            capacity_metadata=intent_fleet_metadata(intent_fleet),
        )
        resource_ids = {
            "llm": self.llm_scaling.resource_id,
            "intent": self.intent_scaling.resource_id,
        }
        # The maximum in force, published each minute: capacity-pinned-at-max compares with it.
        self.scaling_limits = ScalingLimitsPublisher(
            self,
            "ScalingLimits",
            environment_name=settings.name,
            resource_ids=list(resource_ids.values()),
            encryption_key=encryption_key,
        )

        self.calendar_reconciler: ReleaseCalendarReconciler | None = None
        if scaling_plan.calendar_json is not None:
            calendar = settings.release_calendar
            hour, minute = (int(part) for part in calendar.daily_run_utc.split(":"))
            self.calendar_reconciler = ReleaseCalendarReconciler(
                self,
                "ReleaseCalendar",
                environment_name=settings.name,
                calendar_json=scaling_plan.calendar_json,
                capacity_models=scaling_plan.calendar_models,
                scalable_targets={t: resource_ids[t] for t in scaling_plan.calendar_models},
                horizon_days=calendar.horizon_days,
                daily_run_utc=(hour, minute),
                encryption_key=encryption_key,
                log_retention=getattr(logs.RetentionDays, _RETENTION[calendar.log_retention_days]),
                alarm_topic=alarm_topic,
            )
            # Reconcile only once the scalable targets exist; it may write only tagged ones.
            for scaling in (self.llm_scaling, self.intent_scaling):
                self.calendar_reconciler.node.add_dependency(scaling)
            scalings = {"llm": self.llm_scaling, "intent": self.intent_scaling}
            for target in scaling_plan.calendar_models:
                self.calendar_reconciler.manage(scalings[target].scalable_target)


        self.dashboard = InferenceDashboard(
            self,
            "Dashboard",
            dashboard_name=f"{settings.resource_prefix}-inference",
            endpoints=[
                DashboardEndpoint(
                    title=f"LLM (vLLM on {llm.instance_type})",
                    endpoint_name=llm_endpoint_name,
                    variant_name=VARIANT_NAME,
                    kind="llm",
                    instance_type=llm.instance_type,
                    scaling=llm.scaling,
                    fleet=llm_fleet,
                    alarms=self.llm_alarms,
                    max_model_len=llm.max_model_len,
                ),
                DashboardEndpoint(
                    title=f"Intent (DistilBERT on {intent.instance_type})",
                    endpoint_name=intent_endpoint_name,
                    variant_name=VARIANT_NAME,
                    kind="intent",
                    instance_type=intent.instance_type,
                    scaling=intent.scaling,
                    fleet=intent_fleet,
                    alarms=self.intent_alarms,
                ),
            ],
            calendar_function_name=(
                self.calendar_reconciler.lambda_function.function_name
                if self.calendar_reconciler
                else None
            ),
            calendar_environment=settings.name if self.calendar_reconciler else None,
            calendar_alarms=self.calendar_reconciler.alarms if self.calendar_reconciler else None,
            calendar_failed_runs_queue_name=(
                self.calendar_reconciler.failed_runs_queue.queue_name
                if self.calendar_reconciler
                else None
            ),
        )
        cdk.CfnOutput(self, "DashboardName", value=f"{settings.resource_prefix}-inference")
        # What `python -m quantization.launch` reads (quantization/job_outputs.py names them).
        cdk.CfnOutput(self, job_outputs.JOB_ROLE_ARN,
                      value=self.quantization_job.iam_role.role_arn)
        cdk.CfnOutput(self, job_outputs.JOB_IMAGE_URI,
                      value=self.quantization_job.ecr_image.image_uri)
        cdk.CfnOutput(self, job_outputs.JOB_SUBNET_IDS,
                      value=cdk.Fn.join(",", self.network.subnet_ids))
        cdk.CfnOutput(self, job_outputs.JOB_SECURITY_GROUP_ID,
                      value=self.network.ec2_security_group.security_group_id)


def intent_fleet_metadata(fleet: FleetPlan) -> dict[str, Any]:
    """The classifier's figures for the template metadata (no concurrency: it is not modelled)."""
    return {
        "per_instance_invocations_per_min": fleet.per_instance_invocations_per_min,
        "concurrency_per_instance": None,
        "request_seconds": None,
        "headroom": fleet.headroom,
        "target_invocations_per_instance_per_min": fleet.target_invocations_per_instance_per_min,
        "decode_status": None,
        "source": fleet.source,
    }


_RETENTION = {7: "ONE_WEEK", 14: "TWO_WEEKS", 30: "ONE_MONTH", 60: "TWO_MONTHS",
              90: "THREE_MONTHS", 180: "SIX_MONTHS", 365: "ONE_YEAR"}
