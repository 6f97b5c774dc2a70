"""A failed release-calendar run is kept: on-failure destination and rule DLQs on one SQS queue,
encrypted with the project key (whose policy lets EventBridge use it), SSL-only, alarmed through
the alarm topic; and the function's writes are limited to the scalable targets it manages.

AWS rules relied on (and where they are documented):

* Lambda sends an asynchronous invocation's record to an on-failure destination after its
  retries; a DLQ would keep only the event — "Capturing records of Lambda asynchronous
  invocations", https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-retain-records.html
* EventBridge sends an event it cannot deliver to a target to the target's DLQ, which must allow
  events.amazonaws.com to SendMessage — "Using dead-letter queues to process undelivered events
  in EventBridge", https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-rule-dlq.html
* A service writing to a queue encrypted with a customer-managed key needs kms:GenerateDataKey
  and kms:Decrypt in the key policy — "Access management for encrypted Amazon SQS queues with
  least privilege policies",
  https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-least-privilege-policy.html
* Put/DeleteScheduledAction act on the scalable-target resource and take aws:ResourceTag —
  "Actions, resources, and condition keys for AWS Application Auto Scaling",
  https://docs.aws.amazon.com/service-authorization/latest/reference/list_awsapplicationautoscaling.html
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from stacks.release_calendar_reconciler import MANAGED_TARGET_TAG
from tests.support.templates import properties

QUEUE_NAME = "manga-assist-prod-release-calendar-failed-runs"
KEY_OUTPUT = "PublishOutputFnGetAttProjectKey"


@pytest.fixture(scope="module")
def queue(prod: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    (found,) = [(k, p) for k, p in properties(prod, "AWS::SQS::Queue").items()
                if p.get("QueueName") == QUEUE_NAME]
    return found


def is_project_key(value: Any) -> bool:
    return KEY_OUTPUT in json.dumps(value)


def test_the_queue_is_encrypted_with_the_project_key_and_keeps_two_weeks(
    queue: tuple[str, dict[str, Any]]
) -> None:
    _, props = queue
    assert is_project_key(props["KmsMasterKeyId"])
    assert props["MessageRetentionPeriod"] == 14 * 24 * 3600


def test_failed_runs_go_to_the_queue_after_lambdas_retries(
    prod: dict[str, Any], queue: tuple[str, dict[str, Any]]
) -> None:
    queue_id, _ = queue
    (function_id,) = [k for k, p in properties(prod, "AWS::Lambda::Function").items()
                      if p.get("Handler") == "lambdas/release_calendar/handler.handler"]
    (config,) = [p for p in properties(prod, "AWS::Lambda::EventInvokeConfig").values()
                 if p["FunctionName"] == {"Ref": function_id}]
    assert config["DestinationConfig"]["OnFailure"]["Destination"] == {
        "Fn::GetAtt": [queue_id, "Arn"]}
    assert config["MaximumRetryAttempts"] == 2
    assert is_project_key(properties(prod, "AWS::Lambda::Function")[function_id]["KmsKeyArn"])


def test_both_rules_keep_undeliverable_events_in_the_same_queue(
    prod: dict[str, Any], queue: tuple[str, dict[str, Any]]
) -> None:
    queue_id, _ = queue
    rules = {k: p for k, p in properties(prod, "AWS::Events::Rule").items()
             if k.startswith("ReleaseCalendar")}
    assert len(rules) == 2
    for rule_id, rule in rules.items():
        (target,) = rule["Targets"]
        assert target["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": [queue_id, "Arn"]}}
        # ... and the queue lets exactly that rule send to it.
        (policy,) = [p for p in properties(prod, "AWS::SQS::QueuePolicy").values()
                     if {"Ref": queue_id} in p["Queues"]]
        statements = policy["PolicyDocument"]["Statement"]
        assert any(s["Effect"] == "Allow" and s["Principal"] == {"Service": "events.amazonaws.com"}
                   and s["Condition"]["ArnEquals"]["aws:SourceArn"] == {
                       "Fn::GetAtt": [rule_id, "Arn"]} for s in statements), rule_id


def test_the_queue_refuses_plain_http(prod: dict[str, Any],
                                      queue: tuple[str, dict[str, Any]]) -> None:
    queue_id, _ = queue
    (policy,) = [p for p in properties(prod, "AWS::SQS::QueuePolicy").values()
                 if {"Ref": queue_id} in p["Queues"]]
    assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport":
                                                                     "false"}}
               for s in policy["PolicyDocument"]["Statement"])


def test_the_project_key_lets_eventbridge_rules_write_to_it(synthesized: Any) -> None:
    foundation = synthesized.template("Prod/Foundation")
    (key,) = properties(foundation, "AWS::KMS::Key").values()
    (statement,) = [s for s in key["KeyPolicy"]["Statement"]
                    if s.get("Principal") == {"Service": "events.amazonaws.com"}]
    assert sorted(statement["Action"]) == ["kms:Decrypt", "kms:GenerateDataKey"]
    assert statement["Condition"]["StringEquals"] == {"aws:SourceAccount": "123456789012"}
    assert statement["Condition"]["ArnLike"]["aws:SourceArn"] == (
        "arn:aws:events:ap-northeast-1:123456789012:rule/*")


def test_a_kept_failure_is_alarmed_through_the_topic(
    prod: dict[str, Any], queue: tuple[str, dict[str, Any]]
) -> None:
    queue_id, _ = queue
    alarms = {p["AlarmName"]: p for p in properties(prod, "AWS::CloudWatch::Alarm").values()
              if "AlarmName" in p}
    queued = alarms["manga-assist-prod-release-calendar-failed-runs-queued"]
    assert (queued["Namespace"], queued["MetricName"]) == (
        "AWS/SQS", "ApproximateNumberOfMessagesVisible")
    assert queued["Dimensions"] == [{"Name": "QueueName",
                                     "Value": {"Fn::GetAtt": [queue_id, "QueueName"]}}]
    assert (queued["Threshold"], queued["ComparisonOperator"]) == (
        1, "GreaterThanOrEqualToThreshold")
    assert queued["AlarmActions"] and all("Topic" in json.dumps(a)
                                          for a in queued["AlarmActions"])
    delivery = alarms["manga-assist-prod-release-calendar-destination-delivery-failures"]
    assert delivery["MetricName"] == "DestinationDeliveryFailures"
    assert "release-calendar-lambda.md" in queued["AlarmDescription"]


def test_writes_are_limited_to_tagged_scalable_targets(prod: dict[str, Any]) -> None:
    targets = properties(prod, "AWS::ApplicationAutoScaling::ScalableTarget").values()
    assert all({"Key": MANAGED_TARGET_TAG, "Value": "prod"} in t["Tags"] for t in targets)
    statements = [s for p in properties(prod, "AWS::IAM::Policy").values()
                  if any("ReleaseCalendarRole" in r["Ref"] for r in p["Roles"])
                  for s in p["PolicyDocument"]["Statement"]]
    (write,) = [s for s in statements if "application-autoscaling:PutScheduledAction"
                in s["Action"]]
    assert sorted(write["Action"]) == ["application-autoscaling:DeleteScheduledAction",
                                       "application-autoscaling:PutScheduledAction"]
    assert write["Resource"] == (
        "arn:aws:application-autoscaling:ap-northeast-1:123456789012:scalable-target/*")
    assert write["Condition"] == {"StringEquals": {f"aws:ResourceTag/{MANAGED_TARGET_TAG}":
                                                   "prod"}}
    unscoped = [s for s in statements if s["Resource"] == "*"]
    assert {a for s in unscoped for a in s["Action"]} == {
        "application-autoscaling:DescribeScalableTargets",
        "application-autoscaling:DescribeScheduledActions"}


def test_dev_has_no_calendar_queue(synthesized: Any) -> None:
    assert properties(synthesized.template("Dev/Serving"), "AWS::SQS::Queue") == {}
