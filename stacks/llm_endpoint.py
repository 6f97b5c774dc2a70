"""The vLLM endpoint: our gateway + vLLM image, AWQ weights and LoRA adapters from S3, on g5.

Everything that sizes GPU memory comes from the GPU budget's plan for the settings; the
container receives it as ``ENGINE_*`` variables and re-checks it against the engine's own KV
report at start-up. What the gateway admits — its per-bucket concurrency caps, the KV watermark,
the context window's shares — is the capacity model's, so the caps are what the pool holds within
the latency SLOs, not the gateway's built-in defaults. Both plans are the environment's, made once
when its settings loaded (:class:`stacks.settings.EnvironmentPlans`).
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from capacity_model import LlmCapacity
from gpu_budget import MemoryPlan
from serving_contract import format_adapters, format_locale_routes, format_routing
from serving_contract.environment import (
    GATEWAY_ADAPTERS,
    GATEWAY_ADAPTERS_DIR,
    GATEWAY_ENGINE,
    GATEWAY_LOCALE_ROUTES,
    GATEWAY_METRICS_ENDPOINT_NAME,
    GATEWAY_METRICS_VARIANT_NAME,
    GATEWAY_MODEL_DIR,
    GATEWAY_ROUTING_TABLE,
    GATEWAY_SERVED_MODEL_NAME,
)
from stacks.artifact_layout import ADAPTERS_DIR, ModelArtifact
from stacks.container_image import repo_image_asset
from stacks.model_endpoint import ModelData, ModelEndpointConstruct, add_model_endpoint
from stacks.network import ModelNetwork
from stacks.settings import LlmEndpointSettings

CUDA13_INFERENCE_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"
"""vLLM 0.33 wheels are built for CUDA 13: the host driver must be ≥ 580
(docs/design-decisions.md#vllm-cuda-13-driver)."""

MODEL_DIR = "/opt/ml/model"
LLM_IMAGE_SOURCES: tuple[str, ...] = (
    "containers/llm",
    "artifact_manifest",
    "gpu_budget",
    "metrics_contract",
    "request_buckets",
    "context_window",
    "serving_contract",
    "intents",
    "prompts",
)
"""What the LLM image's build context holds (repo-relative); everything else is excluded."""


def container_environment(
    settings: LlmEndpointSettings,
    plan: MemoryPlan,
    *,
    endpoint_name: str,
    variant_name: str,
    capacity: LlmCapacity | None = None,
) -> dict[str, str]:
    """The serving container's environment: engine arguments from the GPU budget's plan,
    admission from the capacity model (``capacity``, default: the settings'), the gateway's own
    settings.

    ``ENGINE_*`` carry vLLM ``EngineArgs`` names upper-cased (:meth:`MemoryPlan.engine_env`),
    ``GATEWAY_*`` the gateway's own settings; SageMaker's environment is a string map.
    """
    if capacity is None:
        capacity = settings.capacity_plan()
    if capacity.memory_plan != plan:
        raise ValueError("container_environment: the capacity plan was derived from another "
                         "GPU budget plan than the one given")
    env = plan.engine_env(
        {
            "enable_prefix_caching": settings.engine.enable_prefix_caching,
            "enforce_eager": settings.engine.enforce_eager,
            "max_num_queued_reqs": settings.engine.max_num_queued_reqs,
        }
    )
    env.update(
        {
            GATEWAY_ENGINE: "vllm",
            GATEWAY_MODEL_DIR: MODEL_DIR,
            GATEWAY_SERVED_MODEL_NAME: settings.model.served_model_name,
            GATEWAY_ADAPTERS_DIR: f"{MODEL_DIR}/{ADAPTERS_DIR}",
            GATEWAY_ADAPTERS: format_adapters((a.name, a.folder) for a in settings.adapters),
            GATEWAY_ROUTING_TABLE: format_routing(settings.routing),
            GATEWAY_LOCALE_ROUTES: format_locale_routes(settings.locale_routes),
            GATEWAY_METRICS_ENDPOINT_NAME: endpoint_name,
            GATEWAY_METRICS_VARIANT_NAME: variant_name,
            **capacity.gateway_environment(),
        }
    )
    return env


class LlmEndpoint(ModelEndpointConstruct):
    """A SageMaker real-time endpoint serving the base model and its LoRA adapters.

    The image is built from ``containers/llm``; the model data is the uncompressed S3 prefix
    ``model_artifact`` names (weights, tokenizer, ``adapters/<directory>/``, the manifest
    ``make publish`` wrote); the engine settings are the GPU budget's plan; everything else is
    :func:`add_model_endpoint`'s secure defaults plus the CUDA 13 inference AMI. ``capacity`` is
    the environment's capacity plan (:class:`stacks.settings.EnvironmentPlans`), made once when the
    settings loaded.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        settings: LlmEndpointSettings,
        capacity: LlmCapacity,
        endpoint_name: str,
        initial_instance_count: int,
        artifact_bucket: s3.IBucket,
        model_artifact: ModelArtifact,
        encryption_key: kms.IKey,
        network: ModelNetwork,
        rollback_alarms: Sequence[cloudwatch.IAlarm],
        variant_name: str = "AllTraffic",
    ) -> None:
        super().__init__(scope, id_)
        self.endpoint_name = endpoint_name
        self.variant_name = variant_name
        self.capacity = capacity
        self.memory_plan = self.capacity.memory_plan

        self.ecr_image = repo_image_asset(
            self, "Image", dockerfile="containers/llm/Dockerfile", sources=LLM_IMAGE_SOURCES
        )
        model_data = ModelData.of(artifact_bucket, model_artifact)
        self.resources = add_model_endpoint(
            self,
            endpoint_name=endpoint_name,
            variant_name=variant_name,
            image=self.ecr_image,
            model_data=model_data,
            environment=container_environment(
                settings, self.memory_plan, endpoint_name=endpoint_name,
                variant_name=variant_name, capacity=self.capacity,
            ),
            instance_type=settings.instance_type,
            initial_instance_count=initial_instance_count,
            inference_ami_version=CUDA13_INFERENCE_AMI,
            health=settings.health,
            deployment=settings.deployment,
            encryption_key=encryption_key,
            network=network,
            rollback_alarms=rollback_alarms,
        )
        adapters = ", ".join(a.name for a in settings.adapters) or "none"
        self.add_outputs(
            endpoint_name=endpoint_name,
            description=f"LLM endpoint; `model` may name an adapter ({adapters})",
            export_suffix="LlmEndpointName",
            model_data=model_data,
            model_data_description="Model data: `make publish` uploads the base model here and "
            "each adapter to adapters/<directory>/",
        )
