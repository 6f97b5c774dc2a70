"""A SageMaker model, endpoint config and endpoint with this platform's secure defaults.

Both endpoints (the vLLM one and the intent classifier) are built by :func:`add_model_endpoint`:
network isolation in the isolated subnets; an execution role that reads only the endpoint's
artifacts, pulls only its image and writes only its log group and metrics; least-outstanding-
requests routing; blue/green updates shifted as the settings say (all at once, canary or linear)
with automatic rollback on alarms where SageMaker's deployment guardrails apply (not on Inf1);
endpoint-config names left to CloudFormation so that any change can replace the config; the
endpoint name stable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from gpu_budget import instance_type as catalog_instance
from stacks.artifact_layout import ModelArtifact
from stacks.endpoint_routing import LEAST_OUTSTANDING, RoutingChoice
from stacks.model_role import ModelExecutionRole
from stacks.network import ModelNetwork
from stacks.settings import DeploymentSettings, HealthCheckSettings, guardrails_supported


@dataclass(frozen=True)
class ModelData:
    """Where the model artifacts are: an S3 prefix (ending in ``/``) or a ``model.tar.gz``.

    ``read_prefix`` is the key prefix the execution role may read.
    """

    bucket: s3.IBucket
    key: str
    read_prefix: str

    @classmethod
    def of(cls, bucket: s3.IBucket, artifact: ModelArtifact) -> ModelData:
        """The model data of ``artifact`` (stacks/artifact_layout.py) in ``bucket``."""
        return cls(bucket=bucket, key=artifact.model_data_key, read_prefix=artifact.read_prefix)

    @property
    def is_prefix(self) -> bool:
        """True for an uncompressed prefix (faster to load than an archive for large weights)."""
        return self.key.endswith("/")

    @property
    def uri(self) -> str:
        """``s3://bucket/key``."""
        return f"s3://{self.bucket.bucket_name}/{self.key}"


@dataclass(frozen=True)
class EndpointPlacement:
    """Where an endpoint goes and what it is deployed from, the same for both endpoints: its
    name and variant, its first instance count, its model data (the artifact bucket and the
    artifact's keys), the project key, the models' network and the alarms that roll a
    deployment back. The serving stack builds one per endpoint."""

    endpoint_name: str
    initial_instance_count: int
    artifact_bucket: s3.IBucket
    model_artifact: ModelArtifact
    encryption_key: kms.IKey
    network: ModelNetwork
    rollback_alarms: tuple[cloudwatch.IAlarm, ...]
    variant_name: str = "AllTraffic"
    routing: RoutingChoice = LEAST_OUTSTANDING
    """How SageMaker routes the variant's requests (stacks/endpoint_routing.py)."""

    @property
    def model_data(self) -> ModelData:
        """The endpoint's model data in the artifact bucket."""
        return ModelData.of(self.artifact_bucket, self.model_artifact)


@dataclass(frozen=True)
class EndpointResources:
    """What :func:`add_model_endpoint` created."""

    execution_role: ModelExecutionRole
    sagemaker_model: sagemaker.CfnModel
    sagemaker_endpoint_config: sagemaker.CfnEndpointConfig
    sagemaker_endpoint: sagemaker.CfnEndpoint


class ModelEndpointConstruct(Construct):
    """Base of the endpoint constructs: where the endpoint goes, the resources they built and
    the outputs operators use."""

    resources: EndpointResources

    def __init__(self, scope: Construct, id_: str, *, placement: EndpointPlacement) -> None:
        super().__init__(scope, id_)
        self.placement = placement
        self.endpoint_name = placement.endpoint_name
        self.variant_name = placement.variant_name

    @property
    def execution_role(self) -> ModelExecutionRole:
        """The model's least-privilege execution role."""
        return self.resources.execution_role

    @property
    def sagemaker_model(self) -> sagemaker.CfnModel:
        """The SageMaker model."""
        return self.resources.sagemaker_model

    @property
    def sagemaker_endpoint_config(self) -> sagemaker.CfnEndpointConfig:
        """The endpoint config (its name is left to CloudFormation)."""
        return self.resources.sagemaker_endpoint_config

    @property
    def sagemaker_endpoint(self) -> sagemaker.CfnEndpoint:
        """The endpoint (its name is stable)."""
        return self.resources.sagemaker_endpoint

    def add_outputs(self, *, endpoint_name: str, description: str, export_suffix: str,
                    model_data: ModelData, model_data_description: str) -> None:
        """The endpoint name (exported for clients) and where its model data goes."""
        cdk.CfnOutput(self, "EndpointName", value=endpoint_name, description=description,
                      export_name=f"{cdk.Stack.of(self).stack_name}-{export_suffix}")
        cdk.CfnOutput(self, "ModelDataUri", value=model_data.uri,
                      description=model_data_description)


def add_model_endpoint(
    scope: Construct,
    *,
    placement: EndpointPlacement,
    image: ecr_assets.DockerImageAsset,
    environment: Mapping[str, str],
    instance_type: str,
    inference_ami_version: str | None,
    health: HealthCheckSettings,
    deployment: DeploymentSettings,
) -> EndpointResources:
    """Create the role, model, endpoint config and endpoint inside ``scope``.

    The placement's ``rollback_alarms`` roll a deployment back only where deployment guardrails
    apply: on an instance type they exclude (Inf1) the endpoint gets none, rather than a
    rollback that SageMaker would not perform.
    """
    endpoint_name, network = placement.endpoint_name, placement.network
    model_data = placement.model_data
    guardrails = guardrails_supported(instance_type)
    rollback_alarms = list(placement.rollback_alarms) if guardrails else []
    execution_role = ModelExecutionRole(
        scope,
        "ExecutionRole",
        endpoint_name=endpoint_name,
        artifact_bucket=model_data.bucket,
        artifact_prefix=model_data.read_prefix,
        image=image,
        network=network,
        reads_rollback_alarms=bool(rollback_alarms),
    )
    model = _model(scope, execution_role=execution_role, image=image, model_data=model_data,
                   environment=environment, network=network)
    endpoint_config = _endpoint_config(
        scope, model=model, variant_name=placement.variant_name, instance_type=instance_type,
        initial_instance_count=placement.initial_instance_count,
        inference_ami_version=inference_ami_version, health=health,
        encryption_key=placement.encryption_key, routing=placement.routing)
    endpoint = _endpoint(scope, endpoint_name=endpoint_name, endpoint_config=endpoint_config,
                         deployment=deployment, rollback_alarms=rollback_alarms)
    return EndpointResources(execution_role, model, endpoint_config, endpoint)


def _model(scope: Construct, *, execution_role: ModelExecutionRole,
           image: ecr_assets.DockerImageAsset, model_data: ModelData,
           environment: Mapping[str, str], network: ModelNetwork) -> sagemaker.CfnModel:
    """The SageMaker model: the image, its environment and its data, network-isolated in the
    models' VPC."""
    data_source = (
        sagemaker.CfnModel.ModelDataSourceProperty(
            s3_data_source=sagemaker.CfnModel.S3DataSourceProperty(
                s3_uri=model_data.uri, s3_data_type="S3Prefix", compression_type="None"
            )
        )
        if model_data.is_prefix
        else None
    )
    model = sagemaker.CfnModel(
        scope,
        "Model",
        execution_role_arn=execution_role.iam_role.role_arn,
        enable_network_isolation=True,
        vpc_config=sagemaker.CfnModel.VpcConfigProperty(
            security_group_ids=[network.ec2_security_group.security_group_id],
            subnets=network.subnet_ids,
        ),
        primary_container=sagemaker.CfnModel.ContainerDefinitionProperty(
            image=image.image_uri,
            mode="SingleModel",
            environment=dict(environment),
            model_data_source=data_source,
            model_data_url=None if model_data.is_prefix else model_data.uri,
        ),
    )
    # The role's policy must exist before SageMaker validates the model against it.
    model.node.add_dependency(execution_role)
    return model


def _endpoint_config(scope: Construct, *, model: sagemaker.CfnModel, variant_name: str,
                     instance_type: str, initial_instance_count: int,
                     inference_ami_version: str | None, health: HealthCheckSettings,
                     encryption_key: kms.IKey,
                     routing: RoutingChoice) -> sagemaker.CfnEndpointConfig:
    """One production variant of ``model``, routed as ``routing`` says."""
    return sagemaker.CfnEndpointConfig(
        scope,
        "EndpointConfig",
        # Instance types with local NVMe storage (g5 among them) encrypt it in hardware and
        # reject a KmsKeyId: CreateEndpointConfig fails if one is given.
        kms_key_id=None
        if catalog_instance(instance_type).local_instance_storage
        else encryption_key.key_arn,
        production_variants=[
            sagemaker.CfnEndpointConfig.ProductionVariantProperty(
                variant_name=variant_name,
                model_name=model.attr_model_name,
                instance_type=instance_type,
                initial_instance_count=initial_instance_count,
                initial_variant_weight=1.0,
                inference_ami_version=inference_ami_version,
                container_startup_health_check_timeout_in_seconds=(
                    health.container_startup_health_check_timeout_s
                ),
                model_data_download_timeout_in_seconds=health.model_data_download_timeout_s,
                routing_config=_routing_config(routing),
            )
        ],
    )


def _routing_config(routing: RoutingChoice) -> sagemaker.CfnEndpointConfig.RoutingConfigProperty:
    """The variant's RoutingConfig (the prefix configuration only with PREFIX_AWARE)."""
    prefix = None
    if routing.strategy == "PREFIX_AWARE":
        prefix = sagemaker.CfnEndpointConfig.PrefixAwareRoutingConfigProperty(
            prefix_length=routing.prefix_length,
            concurrency_threshold=routing.concurrency_threshold)
    return sagemaker.CfnEndpointConfig.RoutingConfigProperty(
        routing_strategy=routing.strategy, prefix_aware_routing_config=prefix)


def _endpoint(scope: Construct, *, endpoint_name: str,
              endpoint_config: sagemaker.CfnEndpointConfig, deployment: DeploymentSettings,
              rollback_alarms: Sequence[cloudwatch.IAlarm]) -> sagemaker.CfnEndpoint:
    """The endpoint: blue/green updates, rolled back on ``rollback_alarms`` (none: no
    auto-rollback)."""
    endpoint = sagemaker.CfnEndpoint(
        scope,
        "Endpoint",
        endpoint_name=endpoint_name,
        endpoint_config_name=endpoint_config.attr_endpoint_config_name,
        # Keep the instance count autoscaling chose across updates (the endpoint config's
        # initial count would otherwise reset it mid-day). Sent with UpdateEndpoint.
        retain_all_variant_properties=True,
        exclude_retained_variant_properties=[
            sagemaker.CfnEndpoint.VariantPropertyProperty(variant_property_type="DataCaptureConfig")
        ],
        deployment_config=sagemaker.CfnEndpoint.DeploymentConfigProperty(
            blue_green_update_policy=sagemaker.CfnEndpoint.BlueGreenUpdatePolicyProperty(
                traffic_routing_configuration=traffic_routing(deployment),
                termination_wait_in_seconds=deployment.termination_wait_s,
                maximum_execution_timeout_in_seconds=deployment.maximum_execution_timeout_s,
            ),
            auto_rollback_configuration=sagemaker.CfnEndpoint.AutoRollbackConfigProperty(
                alarms=[
                    sagemaker.CfnEndpoint.AlarmProperty(alarm_name=alarm.alarm_name)
                    for alarm in rollback_alarms
                ]
            )
            if rollback_alarms
            else None,
        ),
    )
    for alarm in rollback_alarms:
        endpoint.node.add_dependency(alarm)
    return endpoint


def traffic_routing(
    deployment: DeploymentSettings,
) -> sagemaker.CfnEndpoint.TrafficRoutingConfigProperty:
    """TrafficRoutingConfig of the settings: ALL_AT_ONCE, CANARY or LINEAR, then ``bake_s``.

    Step sizes are capacity percentages; the settings have checked that a step is at most half
    of the variant's instances at its minimum size (SageMaker's rule).
    """
    percent = deployment.step_percent
    size = (
        sagemaker.CfnEndpoint.CapacitySizeProperty(type="CAPACITY_PERCENT", value=percent)
        if percent is not None
        else None
    )
    return sagemaker.CfnEndpoint.TrafficRoutingConfigProperty(
        type=deployment.traffic_shift.upper(),
        canary_size=size if deployment.traffic_shift == "canary" else None,
        linear_step_size=size if deployment.traffic_shift == "linear" else None,
        wait_interval_in_seconds=deployment.bake_s,
    )
