"""The vLLM endpoint: our gateway + vLLM image, AWQ weights and LoRA adapters from S3, on g5.

Everything that sizes GPU memory comes from the GPU budget's plan for the settings
(:meth:`LlmEndpointSettings.memory_plan`); the container receives it as ``ENGINE_*`` variables
and re-checks it against the engine's own KV report at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from gpu_budget import MemoryPlan, instance_type
from stacks.container_image import repo_image_asset
from stacks.model_role import ModelExecutionRole
from stacks.network import ModelNetwork
from stacks.settings import LlmEndpointSettings

CUDA13_INFERENCE_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"
"""vLLM 0.33 wheels are built for CUDA 13: the host driver must be ≥ 580 (FACTS.md)."""

MODEL_DIR = "/opt/ml/model"
LLM_IMAGE_SOURCES: tuple[str, ...] = ("containers/llm", "gpu_budget", "metrics_contract", "intents")
"""What the LLM image's build context holds (repo-relative); everything else is excluded."""


def container_environment(
    settings: LlmEndpointSettings,
    plan: MemoryPlan,
    *,
    endpoint_name: str,
    variant_name: str,
) -> dict[str, str]:
    """The serving container's environment: engine arguments from the plan, gateway settings.

    ``ENGINE_*`` carry vLLM ``EngineArgs`` names upper-cased (:meth:`MemoryPlan.engine_env`),
    ``GATEWAY_*`` the gateway's own settings; SageMaker's environment is a string map.
    """
    env = plan.engine_env(
        {
            "enable_prefix_caching": settings.engine.enable_prefix_caching,
            "enforce_eager": settings.engine.enforce_eager,
            "max_num_queued_reqs": settings.engine.max_num_queued_reqs,
        }
    )
    routing = ",".join(f"{intent}={target}" for intent, target in sorted(settings.routing.items()))
    locale_routes = ";".join(
        f"{locale}:" + ",".join(f"{src}={dst}" for src, dst in sorted(table.items()))
        for locale, table in sorted(settings.locale_routes.items())
    )
    env.update(
        {
            "GATEWAY_ENGINE": "vllm",
            "GATEWAY_MODEL_DIR": MODEL_DIR,
            "GATEWAY_SERVED_MODEL_NAME": settings.model.served_model_name,
            "GATEWAY_ADAPTERS_DIR": f"{MODEL_DIR}/adapters",
            "GATEWAY_ADAPTERS": ",".join(f"{a.name}={a.folder}" for a in settings.adapters),
            "GATEWAY_ROUTING_TABLE": routing,
            "GATEWAY_LOCALE_ROUTES": locale_routes,
            "GATEWAY_METRICS_ENDPOINT_NAME": endpoint_name,
            "GATEWAY_METRICS_VARIANT_NAME": variant_name,
        }
    )
    return env


class LlmEndpoint(Construct):
    """A SageMaker real-time endpoint serving the base model and its LoRA adapters.

    Opinionated defaults: network isolation in isolated subnets; a role that reads only this
    model's prefix and pulls only this image; the CUDA 13 inference AMI; least-outstanding-
    requests routing; blue/green updates with a canary and automatic rollback on
    ``rollback_alarms``; the endpoint-config name left to CloudFormation so any change can
    replace it; the endpoint name stable per environment.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        settings: LlmEndpointSettings,
        endpoint_name: str,
        initial_instance_count: int,
        artifact_bucket: s3.IBucket,
        encryption_key: kms.IKey,
        network: ModelNetwork,
        rollback_alarms: Sequence[cloudwatch.IAlarm],
        variant_name: str = "AllTraffic",
    ) -> None:
        super().__init__(scope, id_)
        self.endpoint_name = endpoint_name
        self.variant_name = variant_name
        self.memory_plan = settings.memory_plan()
        catalog_entry = instance_type(settings.instance_type)

        self.ecr_image = repo_image_asset(
            self, "Image", dockerfile="containers/llm/Dockerfile", sources=LLM_IMAGE_SOURCES
        )
        model_prefix = settings.model.artifact_prefix
        self.execution_role = ModelExecutionRole(
            self,
            "ExecutionRole",
            endpoint_name=endpoint_name,
            artifact_bucket=artifact_bucket,
            artifact_prefix=model_prefix,
            image=self.ecr_image,
            network=network,
        )

        environment = container_environment(
            settings, self.memory_plan, endpoint_name=endpoint_name, variant_name=variant_name
        )
        self.sagemaker_model = sagemaker.CfnModel(
            self,
            "Model",
            execution_role_arn=self.execution_role.iam_role.role_arn,
            enable_network_isolation=True,
            vpc_config=sagemaker.CfnModel.VpcConfigProperty(
                security_group_ids=[network.ec2_security_group.security_group_id],
                subnets=network.subnet_ids,
            ),
            primary_container=sagemaker.CfnModel.ContainerDefinitionProperty(
                image=self.ecr_image.image_uri,
                mode="SingleModel",
                model_data_source=sagemaker.CfnModel.ModelDataSourceProperty(
                    s3_data_source=sagemaker.CfnModel.S3DataSourceProperty(
                        s3_uri=f"s3://{artifact_bucket.bucket_name}/{model_prefix}/",
                        s3_data_type="S3Prefix",
                        compression_type="None",
                    )
                ),
                environment=environment,
            ),
        )
        # The role's policy must exist before SageMaker validates the model against it.
        self.sagemaker_model.node.add_dependency(self.execution_role)

        self.sagemaker_endpoint_config = sagemaker.CfnEndpointConfig(
            self,
            "EndpointConfig",
            # Instance types with local NVMe storage (g5 among them) encrypt it in hardware and
            # reject a KmsKeyId: CreateEndpointConfig fails if one is given.
            kms_key_id=None if catalog_entry.local_instance_storage else encryption_key.key_arn,
            production_variants=[
                sagemaker.CfnEndpointConfig.ProductionVariantProperty(
                    variant_name=variant_name,
                    model_name=self.sagemaker_model.attr_model_name,
                    instance_type=settings.instance_type,
                    initial_instance_count=initial_instance_count,
                    initial_variant_weight=1.0,
                    inference_ami_version=CUDA13_INFERENCE_AMI,
                    container_startup_health_check_timeout_in_seconds=(
                        settings.health.container_startup_health_check_timeout_s
                    ),
                    model_data_download_timeout_in_seconds=(
                        settings.health.model_data_download_timeout_s
                    ),
                    routing_config=sagemaker.CfnEndpointConfig.RoutingConfigProperty(
                        routing_strategy="LEAST_OUTSTANDING_REQUESTS"
                    ),
                )
            ],
        )

        deployment = settings.deployment
        self.sagemaker_endpoint = sagemaker.CfnEndpoint(
            self,
            "Endpoint",
            endpoint_name=endpoint_name,
            endpoint_config_name=self.sagemaker_endpoint_config.attr_endpoint_config_name,
            # Keep the instance count autoscaling chose across updates (the endpoint config's
            # initial count would otherwise reset it mid-day).
            retain_all_variant_properties=True,
            exclude_retained_variant_properties=[
                sagemaker.CfnEndpoint.VariantPropertyProperty(
                    variant_property_type="DataCaptureConfig"
                )
            ],
            deployment_config=sagemaker.CfnEndpoint.DeploymentConfigProperty(
                blue_green_update_policy=sagemaker.CfnEndpoint.BlueGreenUpdatePolicyProperty(
                    traffic_routing_configuration=sagemaker.CfnEndpoint.TrafficRoutingConfigProperty(
                        type="CANARY",
                        canary_size=sagemaker.CfnEndpoint.CapacitySizeProperty(
                            type="CAPACITY_PERCENT", value=deployment.canary_percent
                        ),
                        wait_interval_in_seconds=deployment.canary_bake_s,
                    ),
                    termination_wait_in_seconds=deployment.termination_wait_s,
                    maximum_execution_timeout_in_seconds=deployment.maximum_execution_timeout_s,
                ),
                auto_rollback_configuration=sagemaker.CfnEndpoint.AutoRollbackConfigProperty(
                    alarms=[
                        sagemaker.CfnEndpoint.AlarmProperty(alarm_name=alarm.alarm_name)
                        for alarm in rollback_alarms
                    ]
                ),
            ),
        )
        for alarm in rollback_alarms:
            self.sagemaker_endpoint.node.add_dependency(alarm)

        adapters = ", ".join(a.name for a in settings.adapters) or "none"
        cdk.CfnOutput(self, "EndpointName", value=endpoint_name,
                      description=f"LLM endpoint; `model` may name an adapter ({adapters})",
                      export_name=f"{cdk.Stack.of(self).stack_name}-LlmEndpointName")
        cdk.CfnOutput(self, "ModelDataUri",
                      value=f"s3://{artifact_bucket.bucket_name}/{model_prefix}/",
                      description="Upload the base model here and each adapter to adapters/<name>/")
