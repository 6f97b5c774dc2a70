"""Names of the stack outputs the quantization launcher reads (DescribeStacks), named once.

The stacks write them (``stacks/foundation_stack.py``, ``stacks/serving_stack.py``) and
``tools.quantize`` reads them, so a renamed output fails the stack tests rather than a
launch. Pure module: the launcher's environment has no CDK.
"""

from __future__ import annotations

FOUNDATION_STACK = "Foundation"
SERVING_STACK = "Serving"

ARTIFACT_BUCKET = "ModelArtifactBucketName"
PROJECT_KEY_ARN = "ProjectKeyArn"
JOB_ROLE_ARN = "QuantizationJobRoleArn"
JOB_IMAGE_URI = "QuantizationJobImageUri"
JOB_SUBNET_IDS = "QuantizationJobSubnetIds"
JOB_SECURITY_GROUP_ID = "QuantizationJobSecurityGroupId"

LLM_MODEL_PREFIX = "LlmModelPrefix"
"""The Serving stack's output naming the prefix its LLM endpoint serves (``make promote`` never
writes there, and takes the adapters from there)."""

REQUIRED: dict[str, tuple[str, ...]] = {
    FOUNDATION_STACK: (ARTIFACT_BUCKET, PROJECT_KEY_ARN),
    SERVING_STACK: (JOB_ROLE_ARN, JOB_IMAGE_URI, JOB_SUBNET_IDS, JOB_SECURITY_GROUP_ID),
}
"""Outputs the launcher needs, per stack of the environment's stage."""


def stack_name(stage_name: str, stack: str) -> str:
    """CloudFormation name of a stack in a stage: ``Prod`` + ``Serving`` → ``Prod-Serving``."""
    return f"{stage_name}-{stack}"
