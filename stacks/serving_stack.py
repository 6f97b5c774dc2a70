"""Serving stack: the models' network, both endpoints, their scaling, alarms and calendar.

It only wires constructs together; each construct's module says what it builds and why.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
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
from stacks.artifact_layout import ArtifactLayout, ModelArtifact, artifact_layout
from stacks.dashboard import InferenceDashboard
from stacks.intent_endpoint import IntentEndpoint
from stacks.llm_endpoint import LlmEndpoint
from stacks.model_endpoint import EndpointPlacement
from stacks.model_tier import ModelTier
from stacks.network import ModelNetwork
from stacks.quantization_job import QuantizationJobResources
from stacks.release_calendar_reconciler import ReleaseCalendarReconciler
from stacks.scaling_limits_publisher import ScalingLimitsPublisher
from stacks.scaling_plan import ScalingPlan, ScalingTarget, plan_scaling
from stacks.settings import (
    LOG_RETENTION_DAYS,
    EnvironmentPlans,
    EnvironmentSettings,
    QuantizationJobSettings,
)

VARIANT_NAME = "AllTraffic"


def acknowledgement_id(where: str) -> str:
    """A release-calendar warning's CDK acknowledgement id, without the spaces and parentheses
    of its place (``recurring[0] (jump).multiplier``), which ``cdk acknowledge`` would cut."""
    cleaned = re.sub(r"[^A-Za-z0-9_.:\[\]-]+", "-", where).replace("-.", ".").strip("-")
    return f"release-calendar:{cleaned}"


class ServingStack(cdk.Stack):
    """Everything that serves traffic in one environment; replaceable without data loss."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        settings: EnvironmentSettings,
        plans: EnvironmentPlans,
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
                logs.RetentionDays, LOG_RETENTION_DAYS[settings.network.flow_log_retention_days]
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
        self.quantization_job = self._quantization_job(settings.quantization, artifact_bucket,
                                                       encryption_key)

        # One capacity plan per endpoint, made when the settings loaded: the gateway's caps, the
        # scaling numbers, the alarms' release-window floor and the template metadata the
        # simulator reads all come from it.
        scaling_plan = plan_scaling(
            {"llm": ScalingTarget(settings.llm.scaling, plans.llm_fleet),
             "intent": ScalingTarget(settings.intent.scaling, plans.intent_fleet)},
            calendar_file=settings.release_calendar.file)
        for warning in scaling_plan.warnings:
            cdk.Annotations.of(self).add_warning_v2(acknowledgement_id(warning.where),
                                                    str(warning))
        endpoint_parts = _EndpointParts(artifact_bucket=artifact_bucket,
                                        layout=artifact_layout(settings),
                                        encryption_key=encryption_key, alarm_topic=alarm_topic)
        self.llm = self._llm_tier(settings, plans, scaling_plan, endpoint_parts)
        self.intent = self._intent_tier(settings, plans, scaling_plan, endpoint_parts)
        tiers = {"llm": self.llm, "intent": self.intent}
        self.scaling_limits = self._scaling_limits(settings.name, tiers, encryption_key)
        self.calendar_reconciler = self._calendar_reconciler(
            settings, scaling_plan, tiers, encryption_key=encryption_key, alarm_topic=alarm_topic)
        self.dashboard = self._dashboard(settings, tiers)
        self._outputs(settings.resource_prefix, endpoint_parts.layout.llm.read_prefix)

    def _quantization_job(self, quantization: QuantizationJobSettings,
                          artifact_bucket: s3.IBucket, encryption_key: kms.IKey
                          ) -> QuantizationJobResources:
        """The AWQ job's role, image and network access; it may write only its own prefixes."""
        job = QuantizationJobResources(
            self,
            "QuantizationJob",
            artifact_bucket=artifact_bucket,
            encryption_key=encryption_key,
            base_model_root=quantization.base_model_root,
            candidates_prefix=quantization.candidates_prefix,
            reports_prefix=quantization.reports_prefix,
            instance_type=quantization.instance_type,
            network=self.network,
        )
        self.network.allow_s3_writes(object_arns=[
            artifact_bucket.arn_for_objects(f"{prefix}/*")
            for prefix in (quantization.candidates_prefix, quantization.reports_prefix)
        ])
        return job

    def _llm_tier(self, settings: EnvironmentSettings, plans: EnvironmentPlans,
                  scaling_plan: ScalingPlan, parts: _EndpointParts) -> ModelTier:
        """The vLLM endpoint with its alarms, scaling and dashboard entry."""
        llm = settings.llm
        llm_fleet = plans.llm_fleet
        llm_endpoint_name = f"{settings.resource_prefix}-llm"
        return ModelTier(
            self, "Llm", title=f"LLM (vLLM on {llm.instance_type})", kind="llm",
            endpoint_name=llm_endpoint_name, variant_name=VARIANT_NAME,
            instance_type=llm.instance_type,
            alarm_rules=llm_alarm_rules(
                llm.alarms, gpu_count=instance_type(llm.instance_type).gpu_count,
                max_capacity=llm.scaling.max_capacity,
                daily_minimum=max(floor.min_capacity for floor in llm_fleet.floors)),
            rollback_rules=ROLLBACK_RULES, alarm_topic=parts.alarm_topic,
            build_endpoint=lambda scope, id_, rollback_alarms: LlmEndpoint(
                scope, id_, settings=llm, capacity=plans.llm_capacity,
                placement=parts.placement(
                    llm_endpoint_name, model_artifact=parts.layout.llm,
                    initial_instance_count=llm.scaling.min_capacity, network=self.network,
                    rollback_alarms=rollback_alarms)),
            scaling=llm.scaling, fleet=llm_fleet, scheduled_actions=scaling_plan.actions["llm"],
            capacity_metadata=plans.llm_capacity.template_metadata(),
            max_model_len=llm.max_model_len,
        )

    def _intent_tier(self, settings: EnvironmentSettings, plans: EnvironmentPlans,
                     scaling_plan: ScalingPlan, parts: _EndpointParts) -> ModelTier:
        """The intent classifier's endpoint with its alarms, scaling and dashboard entry."""
        intent = settings.intent
        intent_endpoint_name = f"{settings.resource_prefix}-intent"
        return ModelTier(
            self, "Intent", title=f"Intent (DistilBERT on {intent.instance_type})",
            kind="intent", endpoint_name=intent_endpoint_name, variant_name=VARIANT_NAME,
            instance_type=intent.instance_type,
            alarm_rules=intent_alarm_rules(intent.alarms,
                                           max_capacity=intent.scaling.max_capacity),
            rollback_rules=INTENT_ROLLBACK_RULES, alarm_topic=parts.alarm_topic,
            build_endpoint=lambda scope, id_, rollback_alarms: IntentEndpoint(
                scope, id_, settings=intent,
                placement=parts.placement(
                    intent_endpoint_name, model_artifact=parts.layout.intent,
                    initial_instance_count=intent.scaling.min_capacity, network=self.network,
                    rollback_alarms=rollback_alarms)),
            scaling=intent.scaling, fleet=plans.intent_fleet,
            scheduled_actions=scaling_plan.actions["intent"],
            capacity_metadata=intent_fleet_metadata(plans.intent_fleet),
        )

    def _scaling_limits(self, environment_name: str, tiers: Mapping[str, ModelTier],
                        encryption_key: kms.IKey) -> ScalingLimitsPublisher:
        """The maximum in force, published each minute: capacity-pinned-at-max compares with
        it."""
        publisher = ScalingLimitsPublisher(
            self,
            "ScalingLimits",
            environment_name=environment_name,
            resource_ids=[tier.resource_id for tier in tiers.values()],
            encryption_key=encryption_key,
        )
        # Its every-minute schedule starts once both variants are registered (after the
        # endpoints are InService: up to 2 x 1,200 s on g5); before, every run would find no
        # scalable target.
        for tier in tiers.values():
            publisher.schedule_rule.node.add_dependency(tier.scaling.scalable_target)
        return publisher

    def _calendar_reconciler(self, settings: EnvironmentSettings, scaling_plan: ScalingPlan,
                             tiers: Mapping[str, ModelTier], *, encryption_key: kms.IKey,
                             alarm_topic: sns.ITopic) -> ReleaseCalendarReconciler | None:
        """The release calendar's Lambda, when the calendar has dated events to keep."""
        if scaling_plan.calendar_json is None:
            return None
        calendar = settings.release_calendar
        hour, minute = (int(part) for part in calendar.daily_run_utc.split(":"))
        reconciler = ReleaseCalendarReconciler(
            self,
            "ReleaseCalendar",
            environment_name=settings.name,
            resource_prefix=settings.resource_prefix,
            calendar_json=scaling_plan.calendar_json,
            capacity_models=scaling_plan.calendar_models,
            scalable_targets={t: tiers[t].resource_id for t in scaling_plan.calendar_models},
            horizon_days=calendar.horizon_days,
            daily_run_utc=(hour, minute),
            encryption_key=encryption_key,
            log_retention=getattr(logs.RetentionDays,
                                  LOG_RETENTION_DAYS[calendar.log_retention_days]),
            alarm_topic=alarm_topic,
        )
        # Reconcile only once the scalable targets exist; it may write only tagged ones.
        for tier in tiers.values():
            reconciler.node.add_dependency(tier.scaling)
        for target in scaling_plan.calendar_models:
            reconciler.manage(tiers[target].scaling.scalable_target)
        return reconciler

    def _dashboard(self, settings: EnvironmentSettings,
                   tiers: Mapping[str, ModelTier]) -> InferenceDashboard:
        """One dashboard for both endpoints and, when there is one, the calendar's Lambda."""
        reconciler = self.calendar_reconciler
        return InferenceDashboard(
            self,
            "Dashboard",
            dashboard_name=f"{settings.resource_prefix}-inference",
            endpoints=[tier.dashboard_entry for tier in tiers.values()],
            calendar_function_name=reconciler.lambda_function.function_name if reconciler
            else None,
            calendar_environment=settings.name if reconciler else None,
            calendar_alarms=reconciler.alarms if reconciler else None,
            calendar_failed_runs_queue_name=(reconciler.failed_runs_queue.queue_name
                                             if reconciler else None),
        )

    def _outputs(self, resource_prefix: str, llm_model_prefix: str) -> None:
        """The dashboard's name and what `python -m tools.quantize` reads
        (quantization/job_outputs.py names them)."""
        cdk.CfnOutput(self, "DashboardName", value=f"{resource_prefix}-inference")
        cdk.CfnOutput(self, job_outputs.JOB_ROLE_ARN,
                      value=self.quantization_job.iam_role.role_arn)
        cdk.CfnOutput(self, job_outputs.JOB_IMAGE_URI,
                      value=self.quantization_job.ecr_image.image_uri)
        cdk.CfnOutput(self, job_outputs.JOB_SUBNET_IDS,
                      value=cdk.Fn.join(",", self.network.subnet_ids))
        cdk.CfnOutput(self, job_outputs.JOB_SECURITY_GROUP_ID,
                      value=self.network.ec2_security_group.security_group_id)
        cdk.CfnOutput(self, job_outputs.LLM_MODEL_PREFIX, value=llm_model_prefix,
                      description="The prefix the LLM endpoint serves (make promote never writes "
                      "it and copies the adapters from it).")


@dataclass(frozen=True)
class _EndpointParts:
    """What both endpoints are built from: the artifact bucket and its layout, the project key,
    the alarm topic."""

    artifact_bucket: s3.IBucket
    layout: ArtifactLayout
    encryption_key: kms.IKey
    alarm_topic: sns.ITopic

    def placement(self, endpoint_name: str, *, model_artifact: ModelArtifact,
                  initial_instance_count: int, network: ModelNetwork,
                  rollback_alarms: Sequence[cloudwatch.IAlarm]) -> EndpointPlacement:
        """Where one endpoint goes: in the models' network, its data in the artifact bucket,
        encrypted with the project key, in the variant :data:`VARIANT_NAME`."""
        return EndpointPlacement(
            endpoint_name=endpoint_name, variant_name=VARIANT_NAME,
            initial_instance_count=initial_instance_count,
            artifact_bucket=self.artifact_bucket, model_artifact=model_artifact,
            encryption_key=self.encryption_key, network=network,
            rollback_alarms=tuple(rollback_alarms))


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

