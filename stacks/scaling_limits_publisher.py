"""The scaling-limits publisher: each variant's capacity range in force, as a metric, every minute.

``capacity-pinned-at-max`` must page when a variant sits at the maximum in force — 6 at night in
production, 20 by day, a release pre-scale's or a dated event's — and no AWS metric carries that
maximum. This small function (``lambdas/scaling_limits``) publishes what DescribeScalableTargets
reports as ``MaxCapacityInForce``/``MinCapacityInForce`` once a minute, in every environment,
for both endpoints. It needs only read access to Application Auto Scaling.

A failed minute is not retried (the next run supersedes it) and not kept: its absence is what
the ``capacity-limits-missing`` alarm watches.
"""

from __future__ import annotations

from collections.abc import Sequence

import aws_cdk as cdk
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks.container_image import VPC_GUIDANCE, lambda_logs_and_role, repo_python_function
from stacks.nag import acknowledge, acknowledge_checkov, acknowledge_guard

LAMBDA_SOURCES: tuple[str, ...] = ("lambdas/scaling_limits", "metrics_contract", "request_buckets")
HANDLER = "lambdas/scaling_limits/handler.handler"
PUBLISH_EVERY = cdk.Duration.minutes(1)
"""The pinned alarm's period: one datapoint per minute (gaps repeat the last value)."""
LOG_RETENTION = logs.RetentionDays.ONE_YEAR
"""A year, as every log group here (Control Tower CT.CLOUDWATCH.PR.2): 1,440 short runs a day
are a few hundred MB a year (docs/design-decisions.md#log-retention)."""


class ScalingLimitsPublisher(Construct):
    """The function, its one-minute schedule and its read-only role."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        environment_name: str,
        resource_ids: Sequence[str],
        encryption_key: kms.IKey,
    ) -> None:
        super().__init__(scope, id_)
        if not resource_ids:
            raise ValueError("ScalingLimitsPublisher: resource_ids is empty; give the variants' "
                             "'endpoint/<name>/variant/<name>' ids")
        log_group, role = lambda_logs_and_role(
            self, encryption_key=encryption_key, retention=LOG_RETENTION,
            description="Scaling-limits publisher: read the variants' scalable targets")
        role.add_to_policy(
            iam.PolicyStatement(
                sid="ReadScalableTargets",
                actions=["application-autoscaling:DescribeScalableTargets"],
                resources=["*"],
            )
        )
        acknowledge(
            role,
            "AwsSolutions-IAM5",
            "DescribeScalableTargets supports no resource-level permissions (Service "
            "Authorization Reference, Application Auto Scaling), hence Resource *; it only "
            "reads. The log wildcard is this function's own log group's streams.",
            applies_to=["Resource::*", "Resource::<ScalingLimitsLogs*.Arn>:*"],
        )
        self.lambda_function = repo_python_function(
            self,
            "Function",
            handler=HANDLER,
            sources=LAMBDA_SOURCES,
            description=f"Publish each variant's capacity range in force ({environment_name})",
            role=role,
            log_group=log_group,
            timeout=cdk.Duration.seconds(30),
            memory_size=128,
            # A failed or late minute is superseded by the next one: no retries, no stale runs.
            retry_attempts=0,
            max_event_age=cdk.Duration.seconds(60),
            environment={"SCALABLE_TARGETS": ",".join(resource_ids)},
            environment_encryption=encryption_key,
        )
        acknowledge_checkov(
            self.lambda_function,
            "CKV_AWS_116",
            "A failed run is superseded a minute later and keeping 1,440 records a day helps "
            "nobody; its absence is what the capacity-limits-missing alarm watches.",
        )
        outside_vpc = ("The function only calls Application Auto Scaling's and CloudWatch's "
                       "regional APIs and reaches nothing inside the models' isolated VPC, which "
                       "has no endpoint for either; attaching it would need two more interface "
                       "endpoints for no isolation gained.")
        acknowledge_checkov(self.lambda_function, "CKV_AWS_117", outside_vpc)
        acknowledge_guard(self.lambda_function, "CT.LAMBDA.PR.3", outside_vpc + VPC_GUIDANCE)
        acknowledge_checkov(
            self.lambda_function,
            "CKV_AWS_115",
            "No reserved concurrency: reserving even 1 fails to deploy in accounts near the "
            "100-execution unreserved minimum; each run takes well under a second.",
        )
        self.schedule_rule = events.Rule(
            self,
            "EveryMinute",
            description="Publish the variants' capacity range in force",
            schedule=events.Schedule.rate(PUBLISH_EVERY),
            targets=[targets.LambdaFunction(self.lambda_function, retry_attempts=0,
                                            max_event_age=cdk.Duration.seconds(60))],
        )
