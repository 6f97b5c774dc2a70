"""Settings of what runs around the endpoints: the delivery pipeline's access, `make smoke`'s
thresholds and the AWQ quantization job."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints, field_validator

from gpu_budget import instance_type
from stacks.settings.base import GitHubRepository, RoleArn, S3Prefix, StrictModel
from stacks.settings.naming import role_name


class DeliverySettings(StrictModel):
    """How the delivery pipeline (GitHub Actions, .github/workflows/) reaches this environment.

    Nothing account-specific is written in the workflows: they ask ``tools.pipeline_settings``
    for these values, so an account or role change is a reviewed config change.
    """

    github_repository: GitHubRepository = Field(
        description="owner/name of the repository whose workflows may assume the role."
    )
    github_environment: Annotated[
        str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$")
    ] = Field(
        description="GitHub environment of the deploy job (required reviewers gate prod); the "
        "role trusts only jobs running in it."
    )
    deploy_role_arn: RoleArn = Field(
        description="Role the pipeline assumes by OIDC (aws-actions/configure-aws-credentials); "
        "docs/delivery.md says how to create it."
    )

    @property
    def deploy_role_name(self) -> str:
        """The role's name (the last part of its ARN)."""
        return role_name(self.deploy_role_arn)


class SmokeSettings(StrictModel):
    """What `make smoke` accepts from the live endpoints after a deploy (tools/smoke)."""

    llm_latency_ms: float = Field(
        20000, gt=0, le=60000,
        description="Whole answer of a non-streamed request (SageMaker cuts at 60 s).",
    )
    llm_time_to_first_token_ms: float = Field(
        3000, gt=0, le=60000, description="First content chunk of the streamed request."
    )
    intent_latency_ms: float = Field(
        1000, gt=0, le=60000, description="The intent endpoint's answer to the whole batch."
    )
    max_tokens: int = Field(48, ge=1, le=1024, description="Tokens each LLM request may use.")
    min_intent_agreement: float = Field(
        0.0, ge=0, le=1,
        description="Share of the intent batch that must get its expected label (0 with a "
        "random or uncalibrated model).",
    )


class QuantizationJobSettings(StrictModel):
    """The AWQ job as a SageMaker training job (`python -m tools.quantize`)."""

    base_model_root: S3Prefix = Field(
        "base-models",
        description="Prefix in the artifact bucket under which base models are uploaded; the "
        "job's role reads nothing else.",
    )
    candidates_prefix: S3Prefix = Field(
        "quantization/models",
        description="Where each run that passes its gate uploads its model, with its own "
        "artifact-manifest.json: <candidates_prefix>/<run id>/. Never served from there and never "
        "written over the served prefix; `make promote` copies a run's model, checked, to "
        "llm.model.artifact_prefix.",
    )
    reports_prefix: S3Prefix = Field(
        "quantization/runs", description="Every run's quality_gate.md/json, pass or fail."
    )
    instance_type: str = Field(
        "ml.g5.4xlarge",
        description="A GPU training instance (g5.4xlarge: one A10G, 64 GiB host memory for the "
        "bf16 model held on the CPU during calibration).",
    )
    volume_size_gb: int = Field(100, ge=30, le=16384)
    max_runtime_s: int = Field(4 * 3600, ge=600, le=28 * 24 * 3600)

    @field_validator("instance_type")
    @classmethod
    def _gpu_instance(cls, value: str) -> str:
        if instance_type(value).accelerator_kind != "gpu":
            raise ValueError("is not a GPU instance; AWQ calibration needs one")
        return value
