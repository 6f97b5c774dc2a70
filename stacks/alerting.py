"""The encrypted SNS topic every alarm of an environment notifies."""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from stacks.settings import AlertSettings


class AlarmTopic(Construct):
    """An SSL-only SNS topic encrypted with the project key, with e-mail subscribers.

    CloudWatch publishes alarm notifications as the ``cloudwatch.amazonaws.com`` service, which
    must be allowed to use the customer-managed key, or every notification is silently dropped.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        encryption_key: kms.Key,
        settings: AlertSettings,
        display_name: str,
    ) -> None:
        super().__init__(scope, id_)
        self.sns_topic = sns.Topic(
            self,
            "Topic",
            display_name=display_name,
            master_key=encryption_key,
            enforce_ssl=True,
        )
        for address in settings.email_subscribers:
            self.sns_topic.add_subscription(subscriptions.EmailSubscription(address))

        encryption_key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchAlarmsToUseKeyForSns",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],
                conditions={"StringEquals": {"aws:SourceAccount": Stack.of(self).account}},
            )
        )

