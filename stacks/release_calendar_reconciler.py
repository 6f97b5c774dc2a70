"""The release-calendar Lambda: keeps the dated release events as scheduled actions.

The stack synthesizes the fixed part of the calendar (daily floors, weekly and yearly pairs);
dated one-off events (a chapter on a known date) are kept by this function, which runs daily,
after every deployment of the serving stack (so actions a replaced scalable target lost come back
at once), and on demand. It owns only actions named ``calendar-dated-*``, and IAM lets it write
scheduled actions only on scalable targets tagged :data:`MANAGED_TARGET_TAG` with its environment.

A failed run is kept, not just logged: both EventBridge rules invoke the function asynchronously,
so a run that still fails after Lambda's retries goes to the function's on-failure destination
(the invocation record: the event, the error, the attempts), and an event EventBridge could not
deliver at all goes to the rules' dead-letter queue. Both are one SQS queue, encrypted with the
project key and alarmed while it holds a message; docs/runbooks/release-calendar-lambda.md says
how to replay one.
"""

from __future__ import annotations

from collections.abc import Mapping

import aws_cdk as cdk
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_ssm as ssm
from constructs import Construct, IConstruct

from release_calendar import CapacityModel, capacity_models_to_json
from stacks.alarm_rules import calendar_lambda_rules
from stacks.alarms import AlarmSet
from stacks.container_image import VPC_GUIDANCE, lambda_logs_and_role, repo_python_function
from stacks.nag import acknowledge, acknowledge_checkov, acknowledge_guard

LAMBDA_SOURCES: tuple[str, ...] = (
    "lambdas/release_calendar", "release_calendar", "metrics_contract", "request_buckets"
)
HANDLER = "lambdas/release_calendar/handler.handler"
SSM_STANDARD_LIMIT_BYTES = 4096
MANAGED_TARGET_TAG = "mangaassist:release-calendar"
"""Tag on a scalable target whose scheduled actions this environment's reconciler may write;
its value is the environment name (IAM condition ``aws:ResourceTag``)."""
LAMBDA_RETRY_ATTEMPTS = 2
"""Lambda's own retries of a failed asynchronous run (its default, stated): a throttled or
briefly failing API call usually passes a minute later; what still fails goes to the queue."""
MAX_EVENT_AGE = cdk.Duration.hours(6)
"""How long Lambda keeps retrying an event (its default, stated): a day-old reconcile is
superseded by the next daily run anyway."""
FAILED_RUN_RETENTION = cdk.Duration.days(14)
"""SQS's longest retention: a failed run stays visible (and alarmed) for two weeks."""


class ReleaseCalendarReconciler(Construct):
    """The function, its calendar parameter, its triggers and its least-privilege role."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        environment_name: str,
        resource_prefix: str,
        calendar_json: str,
        capacity_models: Mapping[str, CapacityModel],
        scalable_targets: Mapping[str, str],
        horizon_days: int,
        daily_run_utc: tuple[int, int],
        encryption_key: kms.IKey,
        log_retention: logs.RetentionDays,
        alarm_topic: sns.ITopic,
    ) -> None:
        """``scalable_targets`` maps a calendar target to its resource id; the scalable targets
        themselves must carry :data:`MANAGED_TARGET_TAG` = ``environment_name`` (see
        :meth:`manage`), or the function may not write their actions. ``resource_prefix`` starts
        the queue's and the alarms' names (:func:`stacks.settings.resource_prefix`)."""
        super().__init__(scope, id_)
        self.environment_name = environment_name
        missing = sorted(set(scalable_targets) - set(capacity_models))
        if missing:
            raise ValueError(f"no capacity model for scalable target(s) {missing}")

        self.ssm_parameter = self._calendar_parameter(calendar_json)
        log_group, role = self._role(encryption_key=encryption_key, log_retention=log_retention)
        self.failed_runs_queue = self._failed_runs_queue(resource_prefix, encryption_key)
        self.lambda_function = self._function(
            role=role, log_group=log_group, encryption_key=encryption_key,
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
            })
        self.daily_rule, self.after_deploy_rule = self._rules(daily_run_utc)
        self.alarms = self._alarms(resource_prefix, alarm_topic)
        cdk.CfnOutput(self, "FailedRunsQueueUrl", value=self.failed_runs_queue.queue_url,
                      description="Failed release-calendar runs (docs/runbooks/"
                      "release-calendar-lambda.md: how to replay one)")

    def _calendar_parameter(self, calendar_json: str) -> ssm.StringParameter:
        """The calendar as JSON in SSM (advanced tier only when it outgrows the standard one)."""
        return ssm.StringParameter(
            self,
            "Calendar",
            description="MangaAssist release calendar (JSON of config/release_calendar.yaml)",
            string_value=calendar_json,
            tier=ssm.ParameterTier.STANDARD
            if len(calendar_json.encode()) <= SSM_STANDARD_LIMIT_BYTES
            else ssm.ParameterTier.ADVANCED,
        )

    def _role(self, *, encryption_key: kms.IKey, log_retention: logs.RetentionDays
              ) -> tuple[logs.LogGroup, iam.Role]:
        """The function's log group and least-privilege role: read the calendar, describe the
        scaling state, write scheduled actions only on this environment's managed targets."""
        log_group, role = lambda_logs_and_role(
            self, encryption_key=encryption_key, retention=log_retention,
            description="Release-calendar reconciler: read its calendar, manage scheduled actions")
        self.ssm_parameter.grant_read(role)
        # The Describe calls support no resource-level permissions ("Actions, resources, and
        # condition keys for AWS Application Auto Scaling", Service Authorization Reference:
        # https://docs.aws.amazon.com/service-authorization/latest/reference/list_awsapplicationautoscaling.html).
        role.add_to_policy(
            iam.PolicyStatement(
                sid="ReadScalingState",
                actions=[
                    "application-autoscaling:DescribeScalableTargets",
                    "application-autoscaling:DescribeScheduledActions",
                ],
                resources=["*"],
            )
        )
        # Put/DeleteScheduledAction act on the scalable-target resource (its ARN ends in a random
        # id, unknown at synth) and take aws:ResourceTag (same reference): writes are limited to
        # scalable targets this environment tagged as calendar-managed.
        stack = cdk.Stack.of(self)
        scalable_target_arns = stack.format_arn(
            service="application-autoscaling", resource="scalable-target", resource_name="*")
        role.add_to_policy(
            iam.PolicyStatement(
                sid="WriteScheduledActionsOnManagedTargets",
                actions=[
                    "application-autoscaling:PutScheduledAction",
                    "application-autoscaling:DeleteScheduledAction",
                ],
                resources=[scalable_target_arns],
                conditions={"StringEquals": {
                    f"aws:ResourceTag/{MANAGED_TARGET_TAG}": self.environment_name}},
            )
        )
        acknowledge(
            role,
            "AwsSolutions-IAM5",
            "DescribeScalableTargets/DescribeScheduledActions support no resource-level "
            "permissions (Resource *). Scheduled-action writes are limited to scalable targets "
            f"tagged {MANAGED_TARGET_TAG}={self.environment_name}; their ARN ends in a random id "
            "unknown at synth, hence scalable-target/*. The log wildcard is this function's own "
            "log group's streams.",
            applies_to=[
                "Resource::*",
                f"Resource::{scalable_target_arns}",
                "Resource::<ReleaseCalendarLogs*.Arn>:*",
            ],
        )
        return log_group, role

    def _failed_runs_queue(self, resource_prefix: str, encryption_key: kms.IKey) -> sqs.Queue:
        """The queue that keeps failed runs (on-failure destination and the rules' DLQ)."""
        # Where failed runs are kept. Lambda sends the on-failure record with the function's
        # execution role (SqsDestination grants it sqs:SendMessage and the key); EventBridge
        # sends undelivered events as events.amazonaws.com (the queue policy the targets add
        # below, and the project key's policy in the foundation stack).
        queue = sqs.Queue(
            self,
            "FailedRuns",
            queue_name=f"{resource_prefix}-release-calendar-failed-runs",
            encryption=sqs.QueueEncryption.KMS,
            encryption_master_key=encryption_key,
            enforce_ssl=True,
            retention_period=FAILED_RUN_RETENTION,
            removal_policy=cdk.RemovalPolicy.DESTROY,
            # A dead-letter store with no dead-letter queue of its own. AWS Control Tower's
            # CT.SQS.PR.1 skips a queue whose redrive permission is allowAll or byQueue, so this
            # states allowAll, SQS's default: it changes nothing in SQS and is an
            # acknowledgement, not a fix. denyAll (no queue redrives into it: it receives only
            # the Lambda's on-failure records and the rules' undelivered events) would be the
            # truthful value, but the rule fails it; byQueue needs source queues.
            redrive_allow_policy=sqs.RedriveAllowPolicy(
                redrive_permission=sqs.RedrivePermission.ALLOW_ALL),
        )
        acknowledge_guard(
            queue, "CT.SQS.PR.2",
            "KmsMasterKeyId is the project key (customer managed, rotated; its key policy lets "
            "EventBridge rules of this account use it), read from the Foundation stack's output.",
            unreadable_value="KmsMasterKeyId: Fn::GetStackOutput")
        acknowledge(
            queue,
            "AwsSolutions-SQS3",
            "This queue is itself the dead-letter store of the release-calendar function (its "
            "on-failure destination and its EventBridge rules' DLQ); nothing consumes it "
            "automatically, an operator replays its messages by hand, so no consumer can fail "
            "and need a further dead-letter queue.",
        )
        return queue

    def _function(self, *, role: iam.Role, log_group: logs.LogGroup, encryption_key: kms.IKey,
                  environment: dict[str, str]) -> lambda_.Function:
        """The reconciling function: asynchronous runs retried by Lambda, then kept in the
        failed-runs queue."""
        function = repo_python_function(
            self,
            "Function",
            handler=HANDLER,
            sources=LAMBDA_SOURCES,
            description="Reconcile dated releases into scheduled actions "
            f"({self.environment_name})",
            role=role,
            log_group=log_group,
            timeout=cdk.Duration.seconds(120),
            memory_size=256,
            # Asynchronous invocations (both rules): retried by Lambda, then the invocation
            # record goes here ("Capturing records of Lambda asynchronous invocations",
            # https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-retain-records.html:
            # a destination keeps the request and the error, a DLQ only the event).
            on_failure=destinations.SqsDestination(self.failed_runs_queue),
            retry_attempts=LAMBDA_RETRY_ATTEMPTS,
            max_event_age=MAX_EVENT_AGE,
            # The project key, not Lambda's AWS-managed one. Lambda decrypts through a KMS grant
            # it creates for the execution role when the function is deployed, with the
            # deploying role's permission ("How do I resolve KMSAccessDeniedException errors
            # from Lambda?", https://repost.aws/knowledge-center/lambda-kmsaccessdeniedexception-errors).
            environment_encryption=encryption_key,
            # No reserved concurrency: reserving even 1 fails to deploy in accounts whose limit is
            # near the 100-execution unreserved minimum. Two overlapping runs are safe: every
            # write is an idempotent upsert or a delete of an action only this function owns.
            environment=environment,
        )

        acknowledge(
            role,
            "AwsSolutions-IAM5",
            "CDK's grant for sending to the KMS-encrypted FailedRuns queue (the on-failure "
            "destination): kms:GenerateDataKey*/ReEncrypt* on the project key only, which SQS "
            "needs to encrypt the invocation record the role sends.",
            applies_to=["Action::kms:GenerateDataKey*", "Action::kms:ReEncrypt*"],
        )
        acknowledge_checkov(
            function,
            "CKV_AWS_116",
            "Failures go to an on-failure destination (AWS::Lambda::EventInvokeConfig, the "
            "FailedRuns queue), which keeps the event and the error; checkov only recognises the "
            "older DeadLetterConfig, which keeps the event alone.",
        )
        outside_vpc = ("The function only calls regional AWS APIs (SSM, Application Auto "
                       "Scaling, CloudWatch Logs) and reaches nothing inside the models' VPC; "
                       "attaching it would need three more interface endpoints in an isolated "
                       "VPC for no isolation gained.")
        acknowledge_checkov(function, "CKV_AWS_117", outside_vpc)
        acknowledge_guard(function, "CT.LAMBDA.PR.3", outside_vpc + VPC_GUIDANCE)
        acknowledge_checkov(
            function,
            "CKV_AWS_115",
            "No reserved concurrency: reserving even 1 fails to deploy in accounts near the "
            "100-execution unreserved minimum, and two overlapping runs are safe (idempotent "
            "upserts, deletes of its own actions only).",
        )
        return function

    def _rules(self, daily_run_utc: tuple[int, int]) -> tuple[events.Rule, events.Rule]:
        """The daily run and the run after every deployment of the stack."""
        hour, minute = daily_run_utc
        # EventBridge's own delivery retries; an event it cannot deliver goes to the same queue
        # ("Using dead-letter queues to process undelivered events in EventBridge",
        # https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-rule-dlq.html).
        daily_rule = events.Rule(
            self,
            "Daily",
            description="Reconcile the release calendar once a day",
            schedule=events.Schedule.cron(minute=str(minute), hour=str(hour)),
            targets=[self._target()],
        )
        after_deploy_rule = events.Rule(
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
            targets=[self._target()],
        )
        return daily_rule, after_deploy_rule

    def _alarms(self, resource_prefix: str, alarm_topic: sns.ITopic) -> AlarmSet:
        """The function's alarms (errors, the failed-runs queue holding a message)."""
        return AlarmSet(
            self,
            "Alarms",
            name_prefix=f"{resource_prefix}-release-calendar",
            dimensions={
                "FunctionName": self.lambda_function.function_name,
                "Environment": self.environment_name,
                "QueueName": self.failed_runs_queue.queue_name,
            },
            rules=calendar_lambda_rules(),
            alarm_topic=alarm_topic,
        )

    def _target(self) -> targets.LambdaFunction:
        return targets.LambdaFunction(
            self.lambda_function,
            retry_attempts=LAMBDA_RETRY_ATTEMPTS,
            dead_letter_queue=self.failed_runs_queue,
        )

    def manage(self, scalable_target: IConstruct) -> None:
        """Tag a scalable target so this environment's reconciler may write its actions."""
        cdk.Tags.of(scalable_target).add(MANAGED_TARGET_TAG, self.environment_name)
