"""One CDK Stage per environment, and the app that holds them."""

from __future__ import annotations

import aws_cdk as cdk
from constructs import Construct

from stacks.foundation_stack import FoundationStack
from stacks.serving_stack import ServingStack
from stacks.settings import (
    FOUNDATION_STACK_ID,
    SERVING_STACK_ID,
    EnvironmentPlans,
    EnvironmentSettings,
)


class MangaAssistStage(cdk.Stage):
    """Every stack of one environment; ``cdk deploy "<stage_name>/*"`` deploys it.

    ``plans`` are the environment's plans made when its settings loaded
    (:func:`stacks.settings.load_environment`); the stacks plan nothing themselves.
    """

    def __init__(self, scope: Construct, *, settings: EnvironmentSettings,
                 plans: EnvironmentPlans) -> None:
        super().__init__(
            scope,
            settings.stage_name,
            env=cdk.Environment(account=settings.account, region=settings.region),
        )
        self.settings = settings
        self.plans = plans
        self.foundation = FoundationStack(self, FOUNDATION_STACK_ID, settings=settings)
        self.serving = ServingStack(
            self,
            SERVING_STACK_ID,
            settings=settings,
            plans=self.plans,
            encryption_key=self.foundation.kms_key,
            alarm_topic=self.foundation.alarm_topic.sns_topic,
        )
        self.serving.node.add_dependency(self.foundation)  # the artifact bucket, by name
        for key, value in settings.tags.items():
            cdk.Tags.of(self).add(key, value)

