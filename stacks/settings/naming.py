"""Physical names that must be stable per environment: the resource prefix, the stacks'
CloudFormation names, the alarms' prefix, the artifact bucket and the deploy role.

Every name is a function of the settings it depends on, so a stack, a tool or a Lambda's
environment can make the same name without holding an :class:`EnvironmentSettings`.
"""

from __future__ import annotations

FOUNDATION_STACK_ID = "Foundation"
SERVING_STACK_ID = "Serving"
"""Stack ids inside each environment's Stage; CloudFormation names them <stage_name>-<id>."""


def resource_prefix(environment_name: str) -> str:
    """Prefix for physical names that must be stable per environment: manga-assist-prod."""
    return f"manga-assist-{environment_name}"


def foundation_stack_name(stage_name: str) -> str:
    """CloudFormation name of the Foundation stack (key, bucket, topic): Prod-Foundation."""
    return f"{stage_name}-{FOUNDATION_STACK_ID}"


def serving_stack_name(stage_name: str) -> str:
    """CloudFormation name of the Serving stack, e.g. Prod-Serving."""
    return f"{stage_name}-{SERVING_STACK_ID}"


def alarm_name_prefix(environment_name: str) -> str:
    """Every alarm of the environment is named with this prefix (the alarm topic's policy lets
    CloudWatch publish for exactly these alarms)."""
    return f"{resource_prefix(environment_name)}-"


def artifact_bucket_name(environment_name: str, *, account: str, region: str) -> str:
    """The model-artifact bucket's name: fixed, so the serving stack needs no export."""
    return f"{resource_prefix(environment_name)}-models-{account}-{region}"


def role_name(role_arn: str) -> str:
    """An IAM role's name: the last part of its ARN (the deploy role's, for one)."""
    return role_arn.rsplit("/", 1)[1]
