"""Every alarm of every environment can reach the people it pages.

An alarm's notification travels publisher -> SNS topic -> the topic's KMS key. The test walks
every synthesized template, finds every publisher of every topic (alarm, OK and
insufficient-data actions of metric and composite alarms; EventBridge targets; any other
reference to a topic fails as unclassified), follows the reference to the topic across stacks
(``Fn::GetStackOutput``, exports) and evaluates the topic's policy and the key's policy for that
publisher with IAM's rules (tests/stacks/policy_model.py). AWS's rules:

* CloudWatch User Guide, "Notifying users on alarm changes", Preventing confused deputy
  security issues
  (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/Notify_Users_Alarm_Changes.html):
  alarms publish as ``cloudwatch.amazonaws.com`` — "The value of aws:SourceArn must be the ARN of
  the alarm that is sending notifications", with the example topic policy allowing
  ``SNS:Publish`` to that service principal on ``ArnLike aws:SourceArn
  arn:aws:cloudwatch:us-east-2:111122223333:alarm:*`` and ``StringEquals aws:SourceAccount``.
* SNS Developer Guide, "Enable compatibility between event sources from AWS services and
  encrypted topics" (https://docs.aws.amazon.com/sns/latest/dg/sns-key-management.html#compatibility-with-aws-services):
  "To allow the AWS service feature to have the kms:GenerateDataKey* and kms:Decrypt
  permissions, add the following statement to the policy of the CMK using the correct service
  principal."
* A topic with an ``AWS::SNS::TopicPolicy`` has that policy instead of SNS's default one (CDK's
  ``enforce_ssl`` writes one), so whatever it does not allow, a service principal may not do.

On the main branch before this change the topic policy held only the SSL-only Deny: every alarm
below failed with "no statement allows it".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tests.stacks.policy_model import (
    Request,
    ResourceRef,
    StackTemplate,
    UnresolvedReference,
    evaluate,
    literal,
    load_stacks,
    resolve,
)

ALARM_TYPES = ("AWS::CloudWatch::Alarm", "AWS::CloudWatch::CompositeAlarm")
ACTION_FIELDS = ("AlarmActions", "OKActions", "InsufficientDataActions")
NOT_PUBLISHERS = {"AWS::SNS::TopicPolicy", "AWS::SNS::Subscription"}
"""Resources that name a topic without publishing to it."""
KEY_ACTIONS = ("kms:GenerateDataKey", "kms:Decrypt")


@dataclass(frozen=True)
class Publisher:
    """Something that publishes to a topic, as the topic's and key's policies see it."""

    where: str
    principal_service: str
    source_arn: str
    source_account: str
    topic: ResourceRef


def _references(value: Any) -> list[Any]:
    """Every intrinsic-function dict inside ``value`` that might name a resource."""
    found: list[Any] = []
    if isinstance(value, dict):
        if len(value) == 1 and next(iter(value)) in (
                "Ref", "Fn::GetAtt", "Fn::GetStackOutput", "Fn::ImportValue"):
            found.append(value)
        else:
            for item in value.values():
                found.extend(_references(item))
    elif isinstance(value, list):
        for item in value:
            found.extend(_references(item))
    return found


def _topic(value: Any, stack: StackTemplate, stacks: list[StackTemplate]) -> ResourceRef | None:
    try:
        target = resolve(value, stack, stacks)
    except UnresolvedReference:
        return None
    return target if target.type == "AWS::SNS::Topic" else None


def find_publishers(stacks: list[StackTemplate]) -> list[Publisher]:
    """Every publisher of every topic; AssertionError for a reference nobody classified."""
    publishers: list[Publisher] = []
    for stack in stacks:
        for logical_id, resource in stack.resources.items():
            kind, props = resource["Type"], resource.get("Properties", {})
            where = f"{stack.display_name}/{logical_id}"
            if kind in ALARM_TYPES:
                for field in ACTION_FIELDS:
                    for action in props.get(field, []):
                        if isinstance(action, str) and action.startswith("arn:aws:sns:"):
                            raise AssertionError(f"{where}.{field}: a literal topic ARN {action} "
                                                 "that no policy in this app governs")
                        topic = _topic(action, stack, stacks)
                        if topic is None:
                            continue  # a scaling policy, an EC2 action, ...
                        name = props.get("AlarmName")
                        assert name is not None, (
                            f"{where} notifies a topic but has no AlarmName: the topic policy "
                            "can only match alarms by name")
                        publishers.append(Publisher(
                            f"{where}.{field}", "cloudwatch.amazonaws.com",
                            f"arn:aws:cloudwatch:{stack.region}:{stack.account}:alarm:"
                            f"{literal(name, stack)}", stack.account, topic))
            elif kind == "AWS::Events::Rule":
                for target in props.get("Targets", []):
                    topic = _topic(target["Arn"], stack, stacks)
                    if topic is not None:
                        assert "Name" in props, f"{where}: a rule publishing to a topic needs a Name"
                        publishers.append(Publisher(
                            where, "events.amazonaws.com",
                            f"arn:aws:events:{stack.region}:{stack.account}:rule/"
                            f"{literal(props['Name'], stack)}", stack.account, topic))
            elif kind not in NOT_PUBLISHERS and kind != "AWS::SNS::Topic":
                for reference in _references(props):
                    topic = _topic(reference, stack, stacks)
                    assert topic is None, (
                        f"{where} ({kind}) references the topic {topic.logical_id} in a way this "
                        "test does not classify: teach it how that resource publishes")
    return publishers


def topic_policy_statements(topic: ResourceRef) -> list[dict[str, Any]]:
    policies = [r["Properties"] for r in topic.stack.resources.values()
                if r["Type"] == "AWS::SNS::TopicPolicy"
                and any(t == {"Ref": topic.logical_id} for t in r["Properties"]["Topics"])]
    assert len(policies) == 1, f"{topic.logical_id}: expected one topic policy, {len(policies)}"
    return list(policies[0]["PolicyDocument"]["Statement"])


def key_policy(topic: ResourceRef, stacks: list[StackTemplate]) -> tuple[ResourceRef, list[Any]]:
    key_id = topic.resource["Properties"].get("KmsMasterKeyId")
    assert key_id is not None, f"{topic.logical_id}: the alarm topic must be encrypted"
    key = resolve(key_id, topic.stack, stacks)
    assert key.type == "AWS::KMS::Key", key.type
    return key, list(key.resource["Properties"]["KeyPolicy"]["Statement"])


def undeliverable(stacks: list[StackTemplate]) -> list[str]:
    """Why each publisher cannot deliver (empty when every one can)."""
    problems: list[str] = []
    for publisher in find_publishers(stacks):
        context = {"aws:SourceArn": publisher.source_arn,
                   "aws:SourceAccount": publisher.source_account,
                   "aws:SecureTransport": "true"}
        topic = publisher.topic
        allowed, why = evaluate(
            topic_policy_statements(topic),
            Request(publisher.principal_service, "sns:Publish", topic.arn, context),
            stack=topic.stack, stacks=stacks)
        if not allowed:
            problems.append(f"{publisher.where}: sns:Publish on {topic.logical_id}: {why}")
        key, statements = key_policy(topic, stacks)
        for action in KEY_ACTIONS:
            allowed, why = evaluate(
                statements, Request(publisher.principal_service, action, key.arn, context),
                stack=key.stack, stacks=stacks)
            if not allowed:
                problems.append(f"{publisher.where}: {action} on {key.logical_id}: {why}")
    return problems


@pytest.fixture(scope="module")
def stacks(synthesized) -> list[StackTemplate]:  # type: ignore[no-untyped-def]
    return load_stacks(synthesized.outdir)


def test_every_alarm_action_reaches_its_topic_and_key(stacks: list[StackTemplate]) -> None:
    assert undeliverable(stacks) == []


@pytest.mark.parametrize("environment", ["Dev", "Prod"])
def test_every_environment_has_alarms_that_page(stacks: list[StackTemplate],
                                                environment: str) -> None:
    """The walk above proves nothing if it finds nothing. In each environment it finds every
    named alarm with actions as a publisher, and every named alarm without actions (the "page"
    children) is inside a composite alarm that is one; the step-scaling alarms (no AlarmName)
    notify scaling policies, not people."""
    mine = [s for s in stacks if s.display_name.startswith(f"{environment}/")]
    publishers = find_publishers(mine)
    assert publishers, f"{environment}: no alarm notifies a topic"
    named = {(s.display_name, logical_id): r["Properties"] for s in mine
             for logical_id, r in s.resources.items()
             if r["Type"] in ALARM_TYPES and "AlarmName" in r["Properties"]}
    assert len(named) >= 10
    with_actions = {f"{stack}/{lid}" for (stack, lid), props in named.items()
                    if any(props.get(field) for field in ACTION_FIELDS)}
    assert {p.where.rsplit(".", 1)[0] for p in publishers} == with_actions
    composite_children = {ref["Fn::GetAtt"][0] for (stack, lid), props in named.items()
                          if "AlarmRule" in props for ref in _references(props["AlarmRule"])}
    silent = {lid for (stack, lid), props in named.items()
              if not any(props.get(field) for field in ACTION_FIELDS)}
    assert silent <= composite_children, silent - composite_children
    assert {p.topic.stack.display_name for p in publishers} == {f"{environment}/Foundation"}


def test_the_topic_admits_only_this_environments_alarms(stacks: list[StackTemplate]) -> None:
    """Scoped as the CloudWatch guide recommends: another account's alarm, or an alarm of the
    other environment in the same account, is refused; the SSL-only Deny still holds."""
    publishers = find_publishers(stacks)
    prod = next(p for p in publishers if p.source_arn.endswith(":alarm:manga-assist-prod-llm-page"))
    statements = topic_policy_statements(prod.topic)

    def decision(source_arn: str, account: str, secure: str = "true") -> bool:
        context = {"aws:SourceArn": source_arn, "aws:SourceAccount": account,
                   "aws:SecureTransport": secure}
        return evaluate(statements, Request("cloudwatch.amazonaws.com", "sns:Publish",
                                            prod.topic.arn, context),
                        stack=prod.topic.stack, stacks=stacks)[0]

    assert decision(prod.source_arn, prod.source_account)
    assert not decision(prod.source_arn.replace("manga-assist-prod-", "manga-assist-dev-"),
                        prod.source_account)
    assert not decision(prod.source_arn.replace(prod.source_account, "999999999999"),
                        "999999999999")
    assert not decision(prod.source_arn, prod.source_account, secure="false")


def test_the_walk_catches_a_topic_policy_without_the_allow(stacks: list[StackTemplate]) -> None:
    """The shape of main before this change: only the SSL-only Deny. Every alarm fails."""
    import copy

    broken = copy.deepcopy(stacks)
    for stack in broken:
        for resource in stack.resources.values():
            if resource["Type"] == "AWS::SNS::TopicPolicy":
                statements = resource["Properties"]["PolicyDocument"]["Statement"]
                statements[:] = [s for s in statements if s["Effect"] == "Deny"]
    problems = undeliverable(broken)
    assert problems
    assert all("implicit deny" in p for p in problems), problems[:3]
    assert len(problems) == len(find_publishers(broken))


def test_the_policy_model_reads_iam_as_iam_does() -> None:
    stack = StackTemplate("T/S", "T-S", "111122223333", "us-east-2", {"Resources": {}})
    request = Request("cloudwatch.amazonaws.com", "sns:Publish",
                      "arn:aws:sns:us-east-2:111122223333:MyTopic",
                      {"aws:SourceArn": "arn:aws:cloudwatch:us-east-2:111122223333:alarm:a-1",
                       "aws:SourceAccount": "111122223333"})
    allow = {"Effect": "Allow", "Principal": {"Service": "cloudwatch.amazonaws.com"},
             "Action": "SNS:Publish", "Resource": "arn:aws:sns:us-east-2:111122223333:MyTopic",
             "Condition": {"ArnLike": {"aws:SourceArn":
                                       "arn:aws:cloudwatch:us-east-2:111122223333:alarm:a-*"}}}
    deny = {"Effect": "Deny", "Principal": "*", "Action": "sns:Publish", "Resource": "*",
            "Condition": {"StringNotEquals": {"aws:SourceAccount": "111122223333"}}}
    assert evaluate([allow], request, stack=stack, stacks=[stack])[0]
    assert evaluate([allow, deny], request, stack=stack, stacks=[stack])[0]
    other = Request(request.principal_service, request.action, request.resource_arn,
                    {**request.context, "aws:SourceAccount": "444455556666"})
    assert evaluate([allow, deny], other, stack=stack, stacks=[stack]) == (
        False, "explicitly denied by ['(no Sid)']")
    missing = Request(request.principal_service, request.action, request.resource_arn, {})
    assert not evaluate([allow], missing, stack=stack, stacks=[stack])[0]
    lambda_request = Request("lambda.amazonaws.com", request.action, request.resource_arn,
                             request.context)
    assert not evaluate([allow], lambda_request, stack=stack, stacks=[stack])[0]
    with pytest.raises(UnresolvedReference):
        evaluate([{**allow, "Condition": {"DateGreaterThan": {"aws:CurrentTime": "x"}}}],
                 request, stack=stack, stacks=[stack])
