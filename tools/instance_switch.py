#!/usr/bin/env python3
"""`make deploy`'s step before the Serving stack: let an instance-type change go through.

    python -m tools.instance_switch --env prod [--dry-run]

SageMaker refuses to update an endpoint when "the update would change the instance type for any
model that is a target for auto scaling"; AWS's procedure is to deregister the variant as a
scalable target first and register it again after the update ("Update endpoints that use auto
scaling", https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-scaling-update.html). Switching
``intent.target`` from inf1 to inf2 (``ml.inf1.xlarge`` -> ``ml.inf2.xlarge``) is such a change.

For each endpoint of the environment this compares the instance type its deployed endpoint
config runs (DescribeEndpoint, DescribeEndpointConfig) with the configured one. Where they differ
and the variant is registered (DescribeScalableTargets), it follows AWS's steps: deletes the
variant's scaling policies and scheduled actions, then deregisters it
(DeregisterScalableTarget). The Serving stack then updates the endpoint and
registers the variant again with its policies and schedule: the scalable target of another
instance type is another resource of the template (stacks/variant_scaling.py,
``scalable_target_id``), created after the endpoint; the old one is retained, not deleted.
Until the deploy finishes the variant keeps its instance count and does not scale.

Exit status: 0 nothing to do or done, 2 the check could not run.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
VARIANT_NAME = "AllTraffic"
"""The variant of both endpoints (stacks/serving_stack.py)."""


@dataclass(frozen=True)
class Variant:
    """One endpoint variant as configured."""

    tier: str
    endpoint_name: str
    variant_name: str
    instance_type: str

    @property
    def resource_id(self) -> str:
        """Application Auto Scaling's id of the variant."""
        return f"endpoint/{self.endpoint_name}/variant/{self.variant_name}"


def configured_variants(settings: Any) -> list[Variant]:
    """Both endpoints' variants as ``settings`` configures them."""
    return [Variant(tier, f"{settings.resource_prefix}-{tier}", VARIANT_NAME,
                    getattr(settings, tier).instance_type) for tier in ("llm", "intent")]


def switch_needed(variant: Variant, deployed_type: str | None, registered: bool) -> str | None:
    """Why the variant must be deregistered before the deploy, or None when it need not be."""
    if deployed_type is None or deployed_type == variant.instance_type or not registered:
        return None
    return (f"{variant.endpoint_name}/{variant.variant_name} runs {deployed_type} and is "
            f"configured for {variant.instance_type}: SageMaker refuses that update while the "
            "variant is registered with Application Auto Scaling")


def unchanged_state(variant: Variant, deployed: str | None) -> str:
    """Why nothing needs deregistering, in words."""
    if deployed is None:
        return "not deployed yet"
    if deployed == variant.instance_type:
        return f"{deployed}, no change"
    return f"{deployed} -> {variant.instance_type}, not registered (nothing to deregister)"


def deployed_instance_type(sagemaker: Any, variant: Variant) -> str | None:
    """The variant's instance type in the endpoint's current config (None: no endpoint)."""
    from botocore.exceptions import ClientError

    try:
        endpoint = sagemaker.describe_endpoint(EndpointName=variant.endpoint_name)
    except ClientError as error:
        if "Could not find endpoint" in str(error):
            return None
        raise
    config = sagemaker.describe_endpoint_config(
        EndpointConfigName=endpoint["EndpointConfigName"])
    for production in config.get("ProductionVariants", []):
        if production.get("VariantName") == variant.variant_name:
            return str(production.get("InstanceType"))
    return None


def is_registered(autoscaling: Any, variant: Variant) -> bool:
    """Whether the variant is a scalable target."""
    found = autoscaling.describe_scalable_targets(
        ServiceNamespace="sagemaker", ResourceIds=[variant.resource_id],
        ScalableDimension=SCALABLE_DIMENSION)
    return bool(found.get("ScalableTargets"))


def deregister(autoscaling: Any, variant: Variant) -> None:
    """AWS's steps: delete the variant's scaling policies (and scheduled actions), then
    deregister it."""
    key = {"ServiceNamespace": "sagemaker", "ResourceId": variant.resource_id,
           "ScalableDimension": SCALABLE_DIMENSION}
    policies = autoscaling.describe_scaling_policies(
        ServiceNamespace="sagemaker", ResourceId=variant.resource_id,
        ScalableDimension=SCALABLE_DIMENSION)["ScalingPolicies"]
    for policy in policies:
        autoscaling.delete_scaling_policy(PolicyName=policy["PolicyName"], **key)
    actions = autoscaling.describe_scheduled_actions(
        ServiceNamespace="sagemaker", ResourceId=variant.resource_id,
        ScalableDimension=SCALABLE_DIMENSION)["ScheduledActions"]
    for action in actions:
        autoscaling.delete_scheduled_action(ScheduledActionName=action["ScheduledActionName"],
                                            **key)
    autoscaling.deregister_scalable_target(**key)


def run(settings: Any, session: Any, out: TextIO, *, dry_run: bool) -> None:
    """Deregister every variant whose instance type the deploy changes."""
    sagemaker = session.client("sagemaker")
    autoscaling = session.client("application-autoscaling")
    for variant in configured_variants(settings):
        deployed = deployed_instance_type(sagemaker, variant)
        reason = switch_needed(variant, deployed, deployed is not None
                               and is_registered(autoscaling, variant))
        if reason is None:
            print(f"ok: {variant.endpoint_name}: {unchanged_state(variant, deployed)}", file=out)
            continue
        if dry_run:
            print(f"would deregister {variant.resource_id}: {reason}", file=out)
            continue
        deregister(autoscaling, variant)
        print(f"deregistered {variant.resource_id}: {reason}; the Serving stack registers it "
              f"again on {variant.instance_type} (until then it keeps its instance count and "
              "does not scale)", file=out)


def main(argv: Sequence[str] | None = None, *, session: Any = None,
         out: TextIO = sys.stderr) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.instance_switch",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="environment: config/<env>.yaml")
    parser.add_argument("--dry-run", action="store_true", help="say what it would deregister")
    args = parser.parse_args(argv)
    from botocore.exceptions import BotoCoreError, ClientError

    from stacks.settings import CONFIG_DIR, SettingsError, load_settings
    from tools.aws_context import aws_session

    try:
        settings = load_settings(args.env, config_dir=Path(
            os.environ.get("MANGAASSIST_CONFIG_DIR", CONFIG_DIR)))
        run(settings, session or aws_session(settings), out, dry_run=args.dry_run)
    except SettingsError as error:
        print(f"instance switch: {error}", file=out)
        return 2
    except (BotoCoreError, ClientError) as error:
        print(f"instance switch: AWS refused: {error}", file=out)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
