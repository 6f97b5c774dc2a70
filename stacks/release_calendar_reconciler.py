"""The release-calendar Lambda: keeps the dated release events as scheduled actions.

The stack synthesizes the fixed part of the calendar (daily floors, weekly and yearly pairs);
dated one-off events (a chapter on a known date) are kept by this function, which runs daily,
after every deployment of the serving stack (so actions a replaced scalable target lost come back
at once), and on demand. It owns only actions named ``calendar-dated-*``.
"""

from __future__ import annotations

from collections.abc import Mapping

import aws_cdk as cdk
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from release_calendar import CapacityModel, capacity_models_to_json
from stacks.alarm_rules import calendar_lambda_rules
from stacks.alarms import AlarmSet
from stacks.container_image import repo_asset_excludes
from stacks.nag import acknowledge
from stacks.settings import REPO_ROOT

LAMBDA_SOURCES: tuple[str, ...] = (
    "lambdas/release_calendar", "release_calendar", "metrics_contract"
)
HANDLER = "lambdas/release_calendar/handler.handler"
SSM_STANDARD_LIMIT_BYTES = 4096


class ReleaseCalendarReconciler(Construct):
    """The function, its calendar parameter, its triggers and its least-privilege role."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        environment_name: str,
        calendar_json: str,
        capacity_models: Mapping[str, CapacityModel],
        scalable_targets: Mapping[str, str],
        horizon_days: int,
        daily_run_utc: tuple[int, int],
        encryption_key: kms.IKey,
        log_retention: logs.RetentionDays,
        alarm_topic: sns.ITopic,
    ) -> None:
        super().__init__(scope, id_)
        missing = sorted(set(scalable_targets) - set(capacity_models))
        if missing:
            raise ValueError(f"no capacity model for scalable target(s) {missing}")

        self.ssm_parameter = ssm.StringParameter(
            self,
            "Calendar",
            description="MangaAssist release calendar (JSON of config/release_calendar.yaml)",
            string_value=calendar_json,
            tier=ssm.ParameterTier.STANDARD
            if len(calendar_json.encode()) <= SSM_STANDARD_LIMIT_BYTES
            else ssm.ParameterTier.ADVANCED,
        )
        log_group = logs.LogGroup(
            self,
            "Logs",
            encryption_key=encryption_key,
            retention=log_retention,
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="Release-calendar reconciler: read its calendar, manage scheduled actions",
        )
        log_group.grant_write(role)
        self.ssm_parameter.grant_read(role)
        role.add_to_policy(
            iam.PolicyStatement(
                sid="ManageScheduledActions",
                actions=[
                    "application-autoscaling:DescribeScalableTargets",
                    "application-autoscaling:DescribeScheduledActions",
                    "application-autoscaling:PutScheduledAction",
                    "application-autoscaling:DeleteScheduledAction",
                ],
                resources=["*"],
            )
        )
        acknowledge(
            role,
            "AwsSolutions-IAM5",
            "Application Auto Scaling's scheduled-action calls cannot be scoped to a resource id "
            "(the scalable-target ARN holds a random id unknown at synth); the function only "
            "writes actions named calendar-dated-* on the targets in its environment. The log "
            "wildcard is this function's own log group's streams.",
            applies_to=["Resource::*", "Resource::<ReleaseCalendarLogs*.Arn>:*"],
        )

        self.lambda_function = lambda_.Function(
            self,
            "Function",
            description=f"Reconcile dated releases into scheduled actions ({environment_name})",
            runtime=lambda_.Runtime.PYTHON_3_14,
            architecture=lambda_.Architecture.ARM_64,
            handler=HANDLER,
            code=lambda_.Code.from_asset(
                str(REPO_ROOT),
                exclude=repo_asset_excludes(LAMBDA_SOURCES),
                ignore_mode=cdk.IgnoreMode.DOCKER,
            ),
            role=role,
            log_group=log_group,
            timeout=cdk.Duration.seconds(120),
            memory_size=256,
            # No reserved concurrency: reserving even 1 fails to deploy in accounts whose limit is
            # near the 100-execution unreserved minimum. Two overlapping runs are safe: every
            # write is an idempotent upsert or a delete of an action only this function owns.
            environment={
                "CALENDAR_PARAMETER": self.ssm_parameter.parameter_name,
                "CALENDAR_CAPACITY_MODELS": capacity_models_to_json(capacity_models),
                **{
                    f"SCALABLE_TARGET_{target.upper()}": resource_id
                    for target, resource_id in sorted(scalable_targets.items())
                },
                "HORIZON_DAYS": str(horizon_days),
                "ENVIRONMENT": environment_name,
                "DRY_RUN": "false",
            },
        )

        hour, minute = daily_run_utc
        self.daily_rule = events.Rule(
            self,
            "Daily",
            description="Reconcile the release calendar once a day",
            schedule=events.Schedule.cron(minute=str(minute), hour=str(hour)),
            targets=[targets.LambdaFunction(self.lambda_function, retry_attempts=2)],
        )
        self.after_deploy_rule = events.Rule(
            self,
            "AfterDeploy",
            description="Reconcile right after every deployment of this stack",
            event_pattern=events.EventPattern(
                source=["aws.cloudformation"],
                detail_type=["CloudFormation Stack Status Change"],
                detail={
                    "stack-id": [cdk.Aws.STACK_ID],
                    "status-details": {"status": ["CREATE_COMPLETE", "UPDATE_COMPLETE"]},
                },
            ),
            targets=[targets.LambdaFunction(self.lambda_function, retry_attempts=2)],
        )
        self.alarms = AlarmSet(
            self,
            "Alarms",
            name_prefix=f"manga-assist-{environment_name}-release-calendar",
            dimensions={
                "FunctionName": self.lambda_function.function_name,
                "Environment": environment_name,
            },
            rules=calendar_lambda_rules(),
            alarm_topic=alarm_topic,
        )
