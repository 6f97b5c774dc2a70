"""AWS facts the settings and the stacks rely on, each with the page it comes from: the regions we
serve in, CloudWatch Logs' retention periods, Application Auto Scaling's and SageMaker's metric
periods, and the SageMaker rule of which deployment a variant can honour."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from stacks.settings.deployment import DeploymentSettings

# Regions with SageMaker real-time inference on GPU instances we use; extend as the platform moves.
KNOWN_REGIONS: frozenset[str] = frozenset(
    {
        "ap-northeast-1", "ap-northeast-2", "ap-northeast-3", "ap-southeast-1", "ap-southeast-2",
        "ap-south-1", "ca-central-1", "eu-central-1", "eu-north-1", "eu-west-1", "eu-west-2",
        "eu-west-3", "sa-east-1", "us-east-1", "us-east-2", "us-west-1", "us-west-2",
    }
)

LOG_RETENTION_DAYS: dict[int, str] = {
    365: "ONE_YEAR", 400: "THIRTEEN_MONTHS", 545: "EIGHTEEN_MONTHS", 731: "TWO_YEARS",
    1096: "THREE_YEARS", 1827: "FIVE_YEARS", 2192: "SIX_YEARS", 2557: "SEVEN_YEARS",
    2922: "EIGHT_YEARS", 3288: "NINE_YEARS", 3653: "TEN_YEARS",
}
"""CloudWatch Logs retention periods of a year or more (PutRetentionPolicy's allowed values) ->
CDK's ``RetentionDays`` member. Shorter ones are refused: AWS Control Tower's proactive control
CT.CLOUDWATCH.PR.2 "Require an Amazon CloudWatch log group to be retained for at least one year",
and a year of these small log groups costs cents (docs/design-decisions.md#log-retention)."""

LogRetentionDays = Literal[365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653]

TRACKING_DATAPOINTS = 3
"""Application Auto Scaling's target-tracking scale-out alarm needs 3 consecutive datapoints
(the simulator's ``tracking_high_datapoints``): 3 minutes on InvocationsPerInstance, 30 s on the
10-second ConcurrentRequestsPerModel."""
HIGH_RESOLUTION_PERIOD_S = 10
"""SageMaker's high-resolution ConcurrentRequestsPerModel "emits data every 10 seconds" (SageMaker
Developer Guide, Define a scaling policy)."""

GUARDRAILS_EXCLUDED_FAMILIES: frozenset[str] = frozenset({"ml.inf1"})
"""Instance families SageMaker's deployment guardrails exclude: "Endpoints that use Inf1
(Inferentia-based) instances" fall back to "a blue/green deployment with all at once traffic
shifting and no final baking period" (SageMaker Developer Guide, Deployment guardrails,
Exclusions: https://docs.aws.amazon.com/sagemaker/latest/dg/deployment-guardrails-exclusions.html).
Guardrails are traffic shifting, baking and auto-rollback, so none of them applies there."""


def guardrails_supported(instance_type: str) -> bool:
    """Whether SageMaker applies deployment guardrails (shifting, baking, rollback) here."""
    return ".".join(instance_type.split(".")[:2]) not in GUARDRAILS_EXCLUDED_FAMILIES



def deployment_problem(
    deployment: DeploymentSettings, *, instance_type: str, min_capacity: int
) -> str | None:
    """Why SageMaker would not honour ``deployment`` on this variant, or None.

    * Inf1 is excluded from deployment guardrails (:data:`GUARDRAILS_EXCLUDED_FAMILIES`): only
      all-at-once without a bake describes what happens there.
    * TrafficRoutingConfig: "CanarySize ... Value must be less than or equal to 50% of the
      variant's total instance count", "LinearStepSize ... Value must be 10-50% of the variant's
      total instance count" (SageMaker API Reference, TrafficRoutingConfig:
      https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_TrafficRoutingConfig.html).
      A step is whole instances, at least one, so the check is made at the variant's smallest
      size, ``min_capacity``: a one-instance variant cannot run a canary at all.
    """
    shift = deployment.traffic_shift
    if not guardrails_supported(instance_type):
        if shift != "all_at_once":
            return (
                f"deployment.traffic_shift: {shift!r} is not honoured on {instance_type}: "
                "SageMaker deployment guardrails exclude Inf1 instances, which fall back to "
                "all-at-once with no baking period (set traffic_shift: all_at_once, bake_s: 0)"
            )
        if deployment.bake_s:
            return (
                f"deployment.bake_s: {deployment.bake_s} is not honoured on {instance_type}: "
                "SageMaker deployment guardrails exclude Inf1 instances (no baking period); "
                "set bake_s: 0"
            )
        return None
    percent = deployment.step_percent
    if percent is None:
        return None
    step_instances = max(1, math.ceil(percent * min_capacity / 100))
    if 2 * step_instances > min_capacity:
        field = "canary_percent" if shift == "canary" else "linear_step_percent"
        return (
            f"deployment.{field}: {percent} % of min_capacity {min_capacity} is a {shift} step "
            f"of {step_instances} instance(s), more than 50 % of the variant's instance count "
            f"(SageMaker TrafficRoutingConfig); use traffic_shift: all_at_once or raise "
            "scaling.min_capacity"
        )
    return None
