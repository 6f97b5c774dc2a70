"""Deployment settings SageMaker honours, refused at synth with one line naming the rule.

AWS's rules:

* SageMaker API Reference, TrafficRoutingConfig
  (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_TrafficRoutingConfig.html):
  "CanarySize: Batch size for the first step to turn on traffic on the new endpoint fleet. Value
  must be less than or equal to 50% of the variant's total instance count." and "LinearStepSize
  [...] Value must be 10-50% of the variant's total instance count." A step is at least one
  instance, so a one-instance variant (Dev) cannot run a canary: the old Dev config did (50 %).
* SageMaker Developer Guide, Deployment guardrails, Exclusions
  (https://docs.aws.amazon.com/sagemaker/latest/dg/deployment-guardrails-exclusions.html): "If
  your endpoint uses any of the following features, you cannot use deployment guardrails on your
  endpoint, and your endpoint will fall back to using a blue/green deployment with all at once
  traffic shifting and no final baking period: [...] Endpoints that use Inf1 (Inferentia-based)
  instances". The old configs gave the inf1 intent endpoint a canary and a bake.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from stacks.settings import (
    DeploymentSettings,
    SettingsError,
    deployment_problem,
    guardrails_supported,
    load_settings,
    parse_settings,
)

CONFIG = Path(__file__).resolve().parents[2] / "config"


def with_deployment(endpoint: str, deployment: dict[str, Any], **scaling: Any) -> dict[str, Any]:
    data = copy.deepcopy(yaml.safe_load((CONFIG / "dev.yaml").read_text()))
    data[endpoint]["deployment"] = deployment
    data[endpoint]["scaling"].update(scaling)
    return data


def refusal(data: dict[str, Any]) -> str:
    with pytest.raises(SettingsError) as info:
        parse_settings(data, source="config/dev.yaml")
    message = str(info.value)
    assert "\n" not in message, "one line per problem"
    return message


def test_a_canary_of_the_whole_one_instance_fleet_is_refused() -> None:
    """The old Dev setting: 50 % of one instance is one instance, the whole fleet."""
    message = refusal(with_deployment(
        "llm", {"traffic_shift": "canary", "canary_percent": 50, "bake_s": 300}))
    assert message == (
        "config/dev.yaml: llm: deployment.canary_percent: 50 % of min_capacity 1 is a canary "
        "step of 1 instance(s), more than 50 % of the variant's instance count (SageMaker "
        "TrafficRoutingConfig); use traffic_shift: all_at_once or raise scaling.min_capacity")


@pytest.mark.parametrize(("shift", "percent", "min_capacity", "ok"), [
    ("canary", 10, 2, True),     # Prod: one of two instances
    ("canary", 50, 2, True),     # exactly half
    ("canary", 50, 3, False),    # ceil(1.5) = 2 of 3
    ("canary", 30, 3, True),     # ceil(0.9) = 1 of 3
    ("canary", 10, 1, False),    # any canary of one instance
    ("linear", 10, 4, True),
    ("linear", 50, 4, True),
    ("linear", 40, 3, False),    # ceil(1.2) = 2 of 3
])
def test_step_sizes_at_the_minimum_instance_count(shift: str, percent: int, min_capacity: int,
                                                  ok: bool) -> None:
    size_field = "canary_percent" if shift == "canary" else "linear_step_percent"
    deployment = DeploymentSettings.model_validate({"traffic_shift": shift, size_field: percent})
    problem = deployment_problem(deployment, instance_type="ml.g5.xlarge",
                                 min_capacity=min_capacity)
    assert (problem is None) == ok, problem
    if not ok:
        assert problem is not None and problem.startswith(f"deployment.{size_field}: ")


@pytest.mark.parametrize("deployment", [
    {"traffic_shift": "canary", "canary_percent": 10},
    {"traffic_shift": "linear", "linear_step_percent": 20},
])
def test_canary_and_linear_are_refused_on_inf1(deployment: dict[str, Any]) -> None:
    message = refusal(with_deployment("intent", deployment))
    assert message == (
        f"config/dev.yaml: intent: deployment.traffic_shift: {deployment['traffic_shift']!r} is "
        "not honoured on ml.inf1.xlarge: SageMaker deployment guardrails exclude Inf1 instances, "
        "which fall back to all-at-once with no baking period (set traffic_shift: all_at_once, "
        "bake_s: 0)")


def test_a_bake_is_refused_on_inf1() -> None:
    message = refusal(with_deployment("intent", {"traffic_shift": "all_at_once", "bake_s": 300}))
    assert message.startswith("config/dev.yaml: intent: deployment.bake_s: 300 is not honoured "
                              "on ml.inf1.xlarge")


def test_the_fleet_refusal_comes_before_the_deployment_rule_on_the_intent() -> None:
    """The intent section's rules run in their old order, fleet plan then deployment: a section
    failing both reports the capacity model's refusal (the message before the settings became
    a package; the planner now runs once the settings have loaded)."""
    data = with_deployment("intent", {"traffic_shift": "all_at_once", "bake_s": 300})
    data["intent"]["capacity"]["per_instance_invocations_per_min"] = float("inf")
    assert refusal(data) == (
        "config/dev.yaml: intent: the capacity model refuses this configuration: "
        "sustainable_invocations_per_min inf; accepted: > 0")
    data["intent"]["capacity"]["per_instance_invocations_per_min"] = 1950
    assert refusal(data).startswith("config/dev.yaml: intent: deployment.bake_s: 300 is not "
                                    "honoured on ml.inf1.xlarge")


def test_inf2_has_guardrails() -> None:
    data = with_deployment("intent", {"traffic_shift": "canary", "canary_percent": 50},
                           min_capacity=2, max_capacity=4)
    data["intent"].update(target="inf2", instance_type="ml.inf2.xlarge",
                          artifact_key="models/intent/distilbert-manga-intent-inf2/model.tar.gz")
    settings = parse_settings(data, source="config/dev.yaml")
    assert settings.intent.deployment.step_percent == 50
    assert guardrails_supported("ml.inf2.xlarge") and guardrails_supported("ml.g5.xlarge")
    assert not guardrails_supported("ml.inf1.xlarge")
    assert not guardrails_supported("ml.inf1.6xlarge")


def test_a_step_size_belongs_to_its_shift() -> None:
    message = refusal(with_deployment(
        "llm", {"traffic_shift": "all_at_once", "canary_percent": 10}))
    assert message == ("config/dev.yaml: llm.deployment: canary_percent applies to traffic_shift "
                       "canary, not all_at_once")


def test_the_shipped_environments_use_what_sagemaker_honours() -> None:
    dev, prod = load_settings("dev"), load_settings("prod")
    assert dev.llm.deployment.traffic_shift == "all_at_once"
    assert dev.llm.deployment.bake_s > 0, "Dev bakes: the rollback alarms watch the new fleet"
    assert prod.llm.deployment.traffic_shift == "canary"
    for settings in (dev, prod):
        assert settings.intent.deployment.traffic_shift == "all_at_once"
        assert settings.intent.deployment.bake_s == 0


def test_the_intent_default_is_what_inf1_gets() -> None:
    data = yaml.safe_load((CONFIG / "dev.yaml").read_text())
    del data["intent"]["deployment"]
    settings = parse_settings(data, source="config/dev.yaml")
    assert settings.intent.deployment.traffic_shift == "all_at_once"
    assert settings.intent.deployment.bake_s == 0


@pytest.mark.parametrize(("deployment", "expected"), [
    ({"traffic_shift": "all_at_once", "bake_s": 300}, ("ALL_AT_ONCE", None, None, 300)),
    ({"traffic_shift": "canary", "bake_s": 600}, ("CANARY", 10, None, 600)),
    ({"traffic_shift": "linear", "linear_step_percent": 25, "bake_s": 120},
     ("LINEAR", None, 25, 120)),
])
def test_each_shift_becomes_its_traffic_routing_config(deployment: dict[str, Any],
                                                      expected: tuple[Any, ...]) -> None:
    from stacks.model_endpoint import traffic_routing

    config = traffic_routing(DeploymentSettings.model_validate(deployment))
    canary = config.canary_size.value if config.canary_size else None  # type: ignore[union-attr]
    linear = (config.linear_step_size.value  # type: ignore[union-attr]
              if config.linear_step_size else None)
    assert (config.type, canary, linear, config.wait_interval_in_seconds) == expected
    for size in (config.canary_size, config.linear_step_size):
        if size is not None:
            assert size.type == "CAPACITY_PERCENT"  # type: ignore[union-attr]
