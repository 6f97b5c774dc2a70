"""The vLLM endpoint: our gateway + vLLM image, AWQ weights and LoRA adapters from S3, on g5.

Everything that sizes GPU memory comes from the GPU budget's plan for the settings; the
container receives it as ``ENGINE_*`` variables and re-checks it against the engine's own KV
report at start-up. What the gateway admits — its per-bucket concurrency caps, the KV watermark,
the context window's shares — is the capacity model's, so the caps are what the pool holds within
the latency SLOs, not the gateway's built-in defaults. Both plans are the environment's, made once
when its settings loaded (:class:`stacks.settings.EnvironmentPlans`).
"""

from __future__ import annotations

from dataclasses import replace

from constructs import Construct

from capacity_model import LlmCapacity
from capacity_model.routing_plan import prefix_length
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
    GATEWAY_SETTING,
)
from stacks.artifact_layout import ADAPTERS_DIR
from stacks.container_image import repo_image_asset
from stacks.endpoint_routing import routing_choice
from stacks.model_endpoint import EndpointPlacement, ModelEndpointConstruct, add_model_endpoint
from stacks.settings import LlmEndpointSettings

CUDA13_INFERENCE_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"
"""vLLM 0.33 wheels are built for CUDA 13: the host driver must be ≥ 580
(docs/design-decisions.md#vllm-cuda-13-driver)."""

MODEL_DIR = str(GATEWAY_SETTING[GATEWAY_MODEL_DIR].default)
"""Where SageMaker puts the model data: the contract's default model directory."""
ENGINE = str(GATEWAY_SETTING[GATEWAY_ENGINE].default)
"""The engine the container serves with: the contract's default (vLLM)."""
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
    capacity: LlmCapacity,
    *,
    endpoint_name: str,
    variant_name: str,
) -> dict[str, str]:
    """The serving container's environment: engine arguments from the GPU budget's plan the
    capacity plan was made from, admission from the capacity model (``capacity``: the
    environment's, :class:`stacks.settings.EnvironmentPlans`), the gateway's own settings.

    ``ENGINE_*`` carry vLLM ``EngineArgs`` names upper-cased (:meth:`MemoryPlan.engine_env`),
    ``GATEWAY_*`` the gateway's own settings; SageMaker's environment is a string map.
    """
    env = capacity.memory_plan.engine_env(
        {
            "enable_prefix_caching": settings.engine.enable_prefix_caching,
            "enforce_eager": settings.engine.enforce_eager,
            "max_num_queued_reqs": settings.engine.max_num_queued_reqs,
        }
    )
    env.update(
        {
            GATEWAY_ENGINE: ENGINE,
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
    settings loaded; ``placement`` says where the endpoint goes (:class:`EndpointPlacement`).
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        settings: LlmEndpointSettings,
        capacity: LlmCapacity,
        placement: EndpointPlacement,
    ) -> None:
        placement = replace(placement, routing=routing_choice(
            settings.routing_strategy, sessions=settings.capacity.sessions,
            prefix_length=prefix_length(capacity),
            concurrency_threshold=capacity.instance.concurrency))
        super().__init__(scope, id_, placement=placement)
        self.capacity = capacity
        self.memory_plan = self.capacity.memory_plan

        self.ecr_image = repo_image_asset(
            self, "Image", dockerfile="containers/llm/Dockerfile", sources=LLM_IMAGE_SOURCES
        )
        self.resources = add_model_endpoint(
            self,
            placement=placement,
            image=self.ecr_image,
            environment=container_environment(
                settings, self.capacity, endpoint_name=placement.endpoint_name,
                variant_name=placement.variant_name,
            ),
            instance_type=settings.instance_type,
            inference_ami_version=CUDA13_INFERENCE_AMI,
            health=settings.health,
            deployment=settings.deployment,
        )
        adapters = ", ".join(a.name for a in settings.adapters) or "none"
        self.add_outputs(
            endpoint_name=placement.endpoint_name,
            description=f"LLM endpoint; `model` may name an adapter ({adapters})",
            export_suffix="LlmEndpointName",
            model_data=placement.model_data,
            model_data_description="Model data: `make publish` uploads the base model here and "
            "each adapter to adapters/<directory>/",
        )
