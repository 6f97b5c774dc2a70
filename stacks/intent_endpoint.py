"""The intent classifier endpoint: DistilBERT compiled for Inferentia, behind our own server.

The model artifact is the ``model.tar.gz`` that ``neuron/compile.py --target inf1|inf2`` packages
(TorchScript per batch size, tokenizer, labels, manifest); the image is built from
``containers/intent`` on the Neuron inference image matching the target (build argument
``TARGET``). The server refuses an artifact compiled for another target. On inf1 SageMaker's
deployment guardrails do not apply: updates are blue/green all at once, without a bake or
automatic rollback (stacks/settings/aws.py, GUARDRAILS_EXCLUDED_FAMILIES).
"""

from __future__ import annotations

from constructs import Construct

from stacks.container_image import repo_image_asset
from stacks.model_endpoint import EndpointPlacement, ModelEndpointConstruct, add_model_endpoint
from stacks.settings import IntentEndpointSettings

INTENT_IMAGE_SOURCES: tuple[str, ...] = (
    "containers/intent",
    "artifact_manifest",
    "intents",
    "metrics_contract",
    "request_buckets",
    "neuron/__init__.py",
    "neuron/targets.py",
    "neuron/manifest.py",
    "neuron/latency.py",
    "neuron/parity.py",
    "neuron/samples.py",
    "neuron/tokenization.py",
    "neuron/runtime.py",
    "neuron/model_archive.py",
)
"""The intent image's build context (the `!` lines of containers/intent/Dockerfile.dockerignore)."""


def intent_environment(
    settings: IntentEndpointSettings, *, endpoint_name: str, variant_name: str
) -> dict[str, str]:
    """The classifier server's environment (``INTENT_*``; see intent_server/settings.py)."""
    env = {
        "INTENT_MODEL_DIR": "/opt/ml/model",
        "INTENT_TARGET": settings.target,
        "INTENT_METRICS_ENDPOINT_NAME": endpoint_name,
        "INTENT_METRICS_VARIANT_NAME": variant_name,
    }
    if settings.model_copies is not None:
        env["INTENT_MODEL_COPIES"] = str(settings.model_copies)
    return env


class IntentEndpoint(ModelEndpointConstruct):
    """A SageMaker endpoint on ml.inf1 (or ml.inf2) serving the compiled intent classifier,
    where ``placement`` says (:class:`EndpointPlacement`)."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        settings: IntentEndpointSettings,
        placement: EndpointPlacement,
    ) -> None:
        super().__init__(scope, id_, placement=placement)
        self.ecr_image = repo_image_asset(
            self,
            "Image",
            dockerfile="containers/intent/Dockerfile",
            sources=INTENT_IMAGE_SOURCES,
            build_args={"TARGET": settings.target},
        )
        self.resources = add_model_endpoint(
            self,
            placement=placement,
            image=self.ecr_image,
            environment=intent_environment(
                settings, endpoint_name=placement.endpoint_name,
                variant_name=placement.variant_name,
            ),
            instance_type=settings.instance_type,
            inference_ami_version=None,
            health=settings.health,
            deployment=settings.deployment,
        )
        self.add_outputs(
            endpoint_name=placement.endpoint_name,
            description="Intent classifier endpoint (intent + confidence + scores)",
            export_suffix="IntentEndpointName",
            model_data=placement.model_data,
            model_data_description="neuron/compile.py's model.tar.gz; `make publish` uploads it",
        )
