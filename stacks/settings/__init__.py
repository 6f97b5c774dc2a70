"""Per-environment settings: one YAML file per environment, one typed, validated model, and the
plans made from it once.

``config/<env>.yaml`` is read by :mod:`~stacks.settings.loading` and nowhere else; every stack
and construct receives the validated :class:`EnvironmentSettings` and the environment's
:class:`EnvironmentPlans` (GPU memory plan, capacity plan, fleet plans) made when it loaded.
Unknown keys are errors (a typo must not silently fall back to a default), and a bad value stops
synth with :class:`SettingsError`, whose message names the file, the field path, the value and
what is accepted.

The package, by job:

* the models, by area: :mod:`~stacks.settings.environment` (the root),
  :mod:`~stacks.settings.foundation` (alerts, artifact bucket, network),
  :mod:`~stacks.settings.scaling`, :mod:`~stacks.settings.deployment`,
  :mod:`~stacks.settings.endpoint` (what both endpoints share), :mod:`~stacks.settings.llm`,
  :mod:`~stacks.settings.intent`, :mod:`~stacks.settings.release_calendar`,
  :mod:`~stacks.settings.jobs` (delivery, smoke, quantization job), on
  :mod:`~stacks.settings.base` (the strict base model and shared field types);
* :mod:`~stacks.settings.loading`: YAML, validation, error messages;
* :mod:`~stacks.settings.plans`: the planners' front door (GPU budget, capacity model);
* :mod:`~stacks.settings.aws`: AWS facts and SageMaker's deployment rule;
* :mod:`~stacks.settings.naming`: physical names stable per environment.

Every public name is importable from ``stacks.settings`` itself.
"""

from stacks.settings.aws import (
    GUARDRAILS_EXCLUDED_FAMILIES,
    HIGH_RESOLUTION_PERIOD_S,
    KNOWN_REGIONS,
    LOG_RETENTION_DAYS,
    TRACKING_DATAPOINTS,
    LogRetentionDays,
    deployment_problem,
    guardrails_supported,
)
from stacks.settings.base import (
    CONFIG_DIR,
    REPO_ROOT,
    AccountId,
    AdapterName,
    ArchiveKey,
    Email,
    EnvironmentName,
    FolderName,
    GitHubRepository,
    LocaleTag,
    LocalTime,
    RepoRelativePath,
    RoleArn,
    S3Prefix,
    StrictModel,
    TagValue,
)
from stacks.settings.deployment import DEFAULT_STEP_PERCENT, DeploymentSettings, TrafficShift
from stacks.settings.endpoint import EndpointAlarmSettings, HealthCheckSettings
from stacks.settings.environment import EnvironmentSettings
from stacks.settings.foundation import AlertSettings, ArtifactBucketSettings, NetworkSettings
from stacks.settings.intent import DeclaredCapacitySettings, IntentEndpointSettings
from stacks.settings.jobs import DeliverySettings, QuantizationJobSettings, SmokeSettings
from stacks.settings.llm import (
    BaseModelSettings,
    BucketDemandSettings,
    ContextWindowSettings,
    ConversationSettings,
    EngineOverrides,
    LlmCapacitySettings,
    LlmEndpointSettings,
    LoraAdapterSettings,
    RateChoiceSettings,
)
from stacks.settings.loading import (
    DEFAULT_ENVIRONMENTS,
    Environment,
    SettingsError,
    available_environments,
    format_validation_error,
    load_environment,
    load_environments,
    load_planned_environments,
    load_settings,
    parse_environment,
    parse_settings,
)
from stacks.settings.naming import (
    FOUNDATION_STACK_ID,
    SERVING_STACK_ID,
    alarm_name_prefix,
    artifact_bucket_name,
    foundation_stack_name,
    resource_prefix,
    role_name,
    serving_stack_name,
)
from stacks.settings.plans import (
    CAPACITY_ERRORS,
    PLANNED_SECTIONS,
    EnvironmentPlans,
    LlmPlans,
    PlanRefused,
    PlansRefused,
    plan_environment,
    plan_intent,
    plan_llm,
    refusal_of,
)
from stacks.settings.release_calendar import ReleaseCalendarSettings
from stacks.settings.scaling import (
    DailyWindowSettings,
    ReleaseCalendarCapacitySettings,
    ScalingSettings,
    StepBandSettings,
    StepScalingSettings,
    SurgeSettings,
    TrafficProfileSettings,
)

__all__ = [
    "CAPACITY_ERRORS",
    "CONFIG_DIR",
    "DEFAULT_ENVIRONMENTS",
    "DEFAULT_STEP_PERCENT",
    "FOUNDATION_STACK_ID",
    "GUARDRAILS_EXCLUDED_FAMILIES",
    "HIGH_RESOLUTION_PERIOD_S",
    "KNOWN_REGIONS",
    "LOG_RETENTION_DAYS",
    "PLANNED_SECTIONS",
    "REPO_ROOT",
    "SERVING_STACK_ID",
    "TRACKING_DATAPOINTS",
    "AccountId",
    "AdapterName",
    "AlertSettings",
    "ArchiveKey",
    "ArtifactBucketSettings",
    "BaseModelSettings",
    "BucketDemandSettings",
    "ContextWindowSettings",
    "ConversationSettings",
    "DailyWindowSettings",
    "DeclaredCapacitySettings",
    "DeliverySettings",
    "DeploymentSettings",
    "Email",
    "EndpointAlarmSettings",
    "EngineOverrides",
    "Environment",
    "EnvironmentName",
    "EnvironmentPlans",
    "EnvironmentSettings",
    "FolderName",
    "GitHubRepository",
    "HealthCheckSettings",
    "IntentEndpointSettings",
    "LlmCapacitySettings",
    "LlmEndpointSettings",
    "LlmPlans",
    "LocalTime",
    "LocaleTag",
    "LogRetentionDays",
    "LoraAdapterSettings",
    "NetworkSettings",
    "PlanRefused",
    "PlansRefused",
    "QuantizationJobSettings",
    "RateChoiceSettings",
    "ReleaseCalendarCapacitySettings",
    "ReleaseCalendarSettings",
    "RepoRelativePath",
    "RoleArn",
    "S3Prefix",
    "ScalingSettings",
    "SettingsError",
    "SmokeSettings",
    "StepBandSettings",
    "StepScalingSettings",
    "StrictModel",
    "SurgeSettings",
    "TagValue",
    "TrafficProfileSettings",
    "TrafficShift",
    "alarm_name_prefix",
    "artifact_bucket_name",
    "available_environments",
    "deployment_problem",
    "format_validation_error",
    "foundation_stack_name",
    "guardrails_supported",
    "load_environment",
    "load_environments",
    "load_planned_environments",
    "load_settings",
    "parse_environment",
    "parse_settings",
    "plan_environment",
    "plan_intent",
    "plan_llm",
    "refusal_of",
    "resource_prefix",
    "role_name",
    "serving_stack_name",
]
