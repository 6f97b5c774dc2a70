"""The scaling-limits publisher as synthesized, in every environment: every minute, both
variants, read-only, no retries, environment encrypted with the project key."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stacks.settings import load_settings
from tests.support.templates import resources

HANDLER = "lambdas/scaling_limits/handler.handler"


def publisher(template: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    (found,) = [(k, r["Properties"]) for k, r in resources(template, "AWS::Lambda::Function").items()
                if r["Properties"].get("Handler") == HANDLER]
    return found


@pytest.mark.parametrize("stage", ["Dev", "Prod"])
def test_publishes_both_variants_every_minute(synthesized: Any, stage: str) -> None:
    template = synthesized.template(f"{stage}/Serving")
    logical_id, function = publisher(template)
    prefix = load_settings(stage.lower()).resource_prefix
    targets = {r["Properties"]["ResourceId"]
               for r in resources(template, "AWS::ApplicationAutoScaling::ScalableTarget").values()}
    assert set(function["Environment"]["Variables"]["SCALABLE_TARGETS"].split(",")) == targets == {
        f"endpoint/{prefix}-llm/variant/AllTraffic", f"endpoint/{prefix}-intent/variant/AllTraffic"}
    (rule,) = [r["Properties"] for r in resources(template, "AWS::Events::Rule").values()
               if any(t["Arn"] == {"Fn::GetAtt": [logical_id, "Arn"]}
                      for t in r["Properties"]["Targets"])]
    assert rule["ScheduleExpression"] == "rate(1 minute)"
    # a late or failed minute is superseded by the next: no retries, no stale deliveries
    assert rule["Targets"][0]["RetryPolicy"] == {"MaximumEventAgeInSeconds": 60,
                                                 "MaximumRetryAttempts": 0}
    (invoke_config,) = [r["Properties"] for r in
                        resources(template, "AWS::Lambda::EventInvokeConfig").values()
                        if r["Properties"]["FunctionName"] == {"Ref": logical_id}]
    assert invoke_config["MaximumRetryAttempts"] == 0
    assert "KmsKeyArn" in function, "environment encrypted with the project key"


@pytest.mark.parametrize("stage", ["Dev", "Prod"])
def test_its_role_only_reads_scalable_targets(synthesized: Any, stage: str) -> None:
    template = synthesized.template(f"{stage}/Serving")
    _, function = publisher(template)
    role = function["Role"]["Fn::GetAtt"][0]
    statements = [s for p in resources(template, "AWS::IAM::Policy").values()
                  if {"Ref": role} in p["Properties"]["Roles"]
                  for s in p["Properties"]["PolicyDocument"]["Statement"]]
    actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str)
                                               else s["Action"])}
    assert actions == {"application-autoscaling:DescribeScalableTargets",
                       "logs:CreateLogStream", "logs:PutLogEvents"}
    assert json.dumps(statements).count('"Resource": "*"') == 1


@pytest.mark.parametrize("stage", ["Dev", "Prod"])
def test_every_endpoint_alarm_set_watches_the_published_maximum(synthesized: Any,
                                                                stage: str) -> None:
    template = synthesized.template(f"{stage}/Serving")
    prefix = load_settings(stage.lower()).resource_prefix
    alarms = {r["Properties"]["AlarmName"]: r["Properties"]
              for r in resources(template, "AWS::CloudWatch::Alarm").values()
              if "AlarmName" in r["Properties"]}
    for endpoint in (f"{prefix}-llm", f"{prefix}-intent"):
        pinned = alarms[f"{endpoint}-capacity-pinned-at-max"]
        watched = {m["MetricStat"]["Metric"]["MetricName"] for m in pinned["Metrics"]
                   if "MetricStat" in m}
        assert "MaxCapacityInForce" in watched
        assert alarms[f"{endpoint}-capacity-limits-missing"]["MetricName"] == "MaxCapacityInForce"
