"""The scaling-limits Lambda against moto's Application Auto Scaling: it publishes the range in
force of each configured variant as EMF (through the metrics contract), follows a changed range
at the next run, and reports a variant that is not registered instead of inventing a value."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

import metrics_contract as mc
from lambdas.scaling_limits import handler as limits_lambda
from tests.support.aws import fake_credentials

LLM = "endpoint/manga-assist-dev-llm/variant/AllTraffic"
INTENT = "endpoint/manga-assist-dev-intent/variant/AllTraffic"
DIMENSION = "sagemaker:variant:DesiredInstanceCount"


@pytest.fixture
def aas(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    fake_credentials(monkeypatch, SCALABLE_TARGETS=f"{LLM},{INTENT}")
    with mock_aws():
        client = boto3.client("application-autoscaling")
        for resource_id, (low, high) in {LLM: (4, 20), INTENT: (2, 8)}.items():
            client.register_scalable_target(ServiceNamespace="sagemaker", ResourceId=resource_id,
                                            ScalableDimension=DIMENSION, MinCapacity=low,
                                            MaxCapacity=high)
        yield client


def emitted(output: str) -> dict[str, dict[str, Any]]:
    """EMF documents printed by the run, by EndpointName."""
    documents = [json.loads(line) for line in output.splitlines()]
    return {d["EndpointName"]: d for d in documents if "_aws" in d}


def test_publishes_the_range_in_force_of_each_variant(aas: Any,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    summary = limits_lambda.handler({}, None)
    documents = emitted(capsys.readouterr().out)
    assert set(documents) == {"manga-assist-dev-llm", "manga-assist-dev-intent"}
    llm = documents["manga-assist-dev-llm"]
    assert (llm["MaxCapacityInForce"], llm["MinCapacityInForce"]) == (20, 4)
    assert llm["VariantName"] == "AllTraffic"
    directive = llm["_aws"]["CloudWatchMetrics"][0]
    assert directive["Namespace"] == mc.MAX_CAPACITY_IN_FORCE.namespace
    assert set(directive["Dimensions"][0]) == set(mc.MAX_CAPACITY_IN_FORCE.dimensions)
    assert {m["Name"] for m in directive["Metrics"]} == {"MaxCapacityInForce",
                                                         "MinCapacityInForce"}
    assert summary["not_registered"] == []


def test_follows_a_scheduled_or_manual_change_at_the_next_run(
    aas: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # What the 01:00 off-peak action does to the range (moto does not apply schedules, so the
    # change is made the way an operator would).
    aas.register_scalable_target(ServiceNamespace="sagemaker", ResourceId=LLM,
                                 ScalableDimension=DIMENSION, MinCapacity=2, MaxCapacity=6)
    limits_lambda.handler({}, None)
    llm = emitted(capsys.readouterr().out)["manga-assist-dev-llm"]
    assert (llm["MaxCapacityInForce"], llm["MinCapacityInForce"]) == (6, 2)


def test_an_unregistered_variant_gets_no_datapoint_and_a_warning(
    aas: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    aas.deregister_scalable_target(ServiceNamespace="sagemaker", ResourceId=INTENT,
                                   ScalableDimension=DIMENSION)
    summary = limits_lambda.handler({}, None)
    output = capsys.readouterr().out
    assert set(emitted(output)) == {"manga-assist-dev-llm"}
    assert summary["not_registered"] == [INTENT]
    assert summary["level"] == "WARNING"
    assert any(json.loads(line).get("not_registered") == [INTENT]
               for line in output.splitlines())


@pytest.mark.parametrize(("value", "message"), [
    ("", "SCALABLE_TARGETS is empty"),
    ("endpoint/x", "SCALABLE_TARGETS has ['endpoint/x']; accepted: "
                   "'endpoint/<endpoint-name>/variant/<variant-name>'"),
    (",".join(f"endpoint/e{i}/variant/v" for i in range(51)), "at most 50"),
])
def test_a_bad_configuration_is_refused_with_what_is_accepted(value: str, message: str) -> None:
    with pytest.raises(limits_lambda.ConfigurationError) as caught:
        limits_lambda.parse_targets(value)
    assert message in str(caught.value)


def test_other_namespaces_and_dimensions_in_the_response_are_ignored() -> None:
    response = {"ScalableTargets": [
        {"ServiceNamespace": "ecs", "ResourceId": LLM, "ScalableDimension": DIMENSION,
         "MinCapacity": 1, "MaxCapacity": 99},
        {"ServiceNamespace": "sagemaker", "ResourceId": LLM, "ScalableDimension": DIMENSION,
         "MinCapacity": 2, "MaxCapacity": 6}]}
    limits, missing = limits_lambda.limits_from_response(response, [LLM, INTENT])
    assert [(x.resource_id, x.min_capacity, x.max_capacity) for x in limits] == [(LLM, 2, 6)]
    assert missing == [INTENT]
