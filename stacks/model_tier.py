"""One model's serving tier: its alarms, its endpoint, its scaling and its dashboard entry.

Both models — the LLM and the intent classifier — are served the same way: alarms first (the
endpoint's blue/green deployment rolls back on some of them), then the endpoint, then the
variant's scaling (target tracking, steps and the scheduled actions the scaling plan gives it),
and one section on the environment's dashboard. :class:`ModelTier` builds them together, so the
serving stack only says which model, with which settings.

It is deliberately not a ``Construct`` of its own: its parts are created in the stack under the
ids ``<prefix>Alarms``, ``<prefix>Endpoint`` and ``<prefix>Scaling``, so grouping them here left
every logical ID — and with it every deployed resource — exactly as it was (the templates
synthesized before and after it was introduced are identical; ``tests/stacks/test_model_tier.py``
keeps the parts where they are).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns
from constructs import Construct

from capacity_model import FleetPlan
from release_calendar import ScheduledCapacity
from stacks.alarms import AlarmRule, EndpointAlarms
from stacks.dashboard import DashboardEndpoint, EndpointKind
from stacks.model_endpoint import ModelEndpointConstruct
from stacks.settings import ScalingSettings
from stacks.variant_scaling import VariantScaling

EndpointBuilder = Callable[[Construct, str, Sequence[cloudwatch.IAlarm]], ModelEndpointConstruct]
"""Builds the endpoint construct in ``scope`` under ``id``, rolling back on these alarms."""

AFTER_SCALABLE_TARGET: tuple[str, ...] = ("capacity-limits-missing",)
"""Alarm rules created only after the variant's scalable target (``capacity_limits_missing_rule``
says why)."""

INVOKE_ACTIONS = ("sagemaker:InvokeEndpoint", "sagemaker:InvokeEndpointWithResponseStream")
"""What a caller needs to use a real-time endpoint, streamed answers included (Service
Authorization Reference, "Actions defined by Amazon SageMaker AI": both take the endpoint ARN)."""


class ModelTier:
    """A model's alarms, endpoint, scaling and dashboard entry (see the module docstring)."""

    def __init__(
        self,
        scope: Construct,
        prefix: str,
        *,
        title: str,
        kind: EndpointKind,
        endpoint_name: str,
        variant_name: str,
        instance_type: str,
        alarm_rules: Sequence[AlarmRule],
        rollback_rules: Sequence[str],
        alarm_topic: sns.ITopic,
        build_endpoint: EndpointBuilder,
        scaling: ScalingSettings,
        fleet: FleetPlan,
        scheduled_actions: Sequence[ScheduledCapacity],
        capacity_metadata: Mapping[str, Any],
        max_model_len: int | None = None,
    ) -> None:
        self.endpoint_name = endpoint_name
        self.variant_name = variant_name
        self.alarms = EndpointAlarms(scope, f"{prefix}Alarms", endpoint_name=endpoint_name,
                                     variant_name=variant_name, rules=alarm_rules,
                                     alarm_topic=alarm_topic)
        self.endpoint = build_endpoint(scope, f"{prefix}Endpoint",
                                       self.alarms.by_name(rollback_rules))
        self.scaling = VariantScaling(
            scope, f"{prefix}Scaling", endpoint=self.endpoint.sagemaker_endpoint,
            endpoint_name=endpoint_name, variant_name=variant_name, settings=scaling,
            fleet=fleet, scheduled_actions=scheduled_actions,
            capacity_metadata=capacity_metadata, instance_type=instance_type)
        # Alarms on what only exists once the variant is registered (the scaling-limits
        # Lambda's metric) are created after its scalable target, so they start evaluating
        # when there can be data.
        for name in AFTER_SCALABLE_TARGET:
            if name in self.alarms.alarms:
                self.alarms.alarms[name].node.add_dependency(self.scaling.scalable_target)
        self.dashboard_entry = DashboardEndpoint(
            title=title, endpoint_name=endpoint_name, variant_name=variant_name, kind=kind,
            instance_type=instance_type, scaling=scaling, fleet=fleet, alarms=self.alarms,
            max_model_len=max_model_len)
        self._stack = cdk.Stack.of(scope)

    @property
    def endpoint_arn(self) -> str:
        """The endpoint's ARN (SageMaker writes endpoint names in lower case in ARNs)."""
        return self._stack.format_arn(service="sagemaker", resource="endpoint",
                                      resource_name=self.endpoint_name.lower())

    @property
    def resource_id(self) -> str:
        """The variant's Application Auto Scaling resource id."""
        return self.scaling.resource_id

    def grant_invoke(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` call this endpoint (streamed or not) and nothing else."""
        return iam.Grant.add_to_principal(grantee=grantee, actions=list(INVOKE_ACTIONS),
                                          resource_arns=[self.endpoint_arn])
