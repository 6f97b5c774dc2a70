"""Autoscaling as synthesized: target tracking, step scaling, floors, release calendar, Lambda."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from aws_cdk.assertions import Match, Template

from capacity_model import FleetPlan, LlmCapacity
from release_calendar import build_static_schedule, parse_schedule
from stacks.settings import REPO_ROOT, load_settings
from tests.support.templates import resources

RESOURCE_ID = {"Dev": "endpoint/manga-assist-dev-llm/variant/AllTraffic",
               "Prod": "endpoint/manga-assist-prod-llm/variant/AllTraffic"}


@pytest.fixture(scope="module")
def fleet(prod_capacity: LlmCapacity) -> FleetPlan:
    """Production's LLM fleet plan (part of the capacity plan made when its settings loaded)."""
    return prod_capacity.fleet


def scalable_target(template: dict[str, Any]) -> dict[str, Any]:
    """The LLM variant's scalable target (the intent endpoint has its own)."""
    targets = resources(template, "AWS::ApplicationAutoScaling::ScalableTarget").values()
    (target,) = [t for t in targets if "-llm/" in t["Properties"]["ResourceId"]]
    return target


@pytest.mark.parametrize("stage", ["Dev", "Prod"])
def test_scalable_target_is_the_llm_variant(synthesized, stage: str) -> None:  # type: ignore[no-untyped-def]
    settings = load_settings(stage.lower()).llm.scaling
    target = scalable_target(synthesized.template(f"{stage}/Serving"))
    props = target["Properties"]
    assert props["ResourceId"] == RESOURCE_ID[stage]
    assert props["ScalableDimension"] == "sagemaker:variant:DesiredInstanceCount"
    assert props["ServiceNamespace"] == "sagemaker"
    assert (props["MinCapacity"], props["MaxCapacity"]) == (
        settings.min_capacity, settings.max_capacity)
    template = synthesized.template(f"{stage}/Serving")
    (endpoint_id,) = [k for k, r in template["Resources"].items()
                      if r["Type"] == "AWS::SageMaker::Endpoint" and k.startswith("LlmEndpoint")]
    assert endpoint_id in target["DependsOn"], "the endpoint must exist before its variant is "\
        "registered"


@pytest.mark.parametrize("stage", ["Dev", "Prod"])
def test_every_scalable_target_carries_the_tag_the_instance_switch_deregisters_by(  # type: ignore[no-untyped-def]
    synthesized, stage: str,
) -> None:
    """tools/instance_switch.py deregisters a variant by its resource id, as the deploy role,
    whose DeregisterForAnInstanceTypeChange statement allows it only on scalable targets tagged
    ``Environment=<tags.Environment>`` (tools/deploy_role.py): a target without that tag would
    be refused and an instance-type change would stop make deploy. Application Auto Scaling
    authorizes its actions on a scalable target by the target's tags through
    ``aws:ResourceTag/<key>`` ("Tagging support for Application Auto Scaling",
    https://docs.aws.amazon.com/autoscaling/application/userguide/resource-tagging-support.html),
    and CloudFormation's ``Tags`` on AWS::ApplicationAutoScaling::ScalableTarget are those tags."""
    from tools.deploy_role import deploy_role_policy
    from tools.instance_switch import SCALABLE_DIMENSION, configured_variants

    settings = load_settings(stage.lower())
    (deregister,) = [s for s in deploy_role_policy(settings)["Statement"]
                     if s["Sid"] == "DeregisterForAnInstanceTypeChange"]
    tag = {"Key": "Environment", "Value": settings.tags["Environment"]}
    assert deregister["Condition"] == {"StringEquals": {
        f"aws:ResourceTag/{tag['Key']}": tag["Value"]}}
    targets = resources(synthesized.template(f"{stage}/Serving"),
                        "AWS::ApplicationAutoScaling::ScalableTarget").values()
    assert {t["Properties"]["ResourceId"] for t in targets} == {
        variant.resource_id for variant in configured_variants(settings)}
    for target in targets:
        props = target["Properties"]
        assert (props["ServiceNamespace"], props["ScalableDimension"]) == (
            "sagemaker", SCALABLE_DIMENSION)
        assert tag in props.get("Tags", []), props["ResourceId"]


def tracking(template: dict[str, Any], metric: str) -> dict[str, Any]:
    (config,) = [r["Properties"]["TargetTrackingScalingPolicyConfiguration"]
                 for k, r in template["Resources"].items()
                 if r["Type"] == "AWS::ApplicationAutoScaling::ScalingPolicy"
                 and k.startswith("LlmScaling")
                 and r["Properties"]["PolicyType"] == "TargetTrackingScaling"
                 and r["Properties"]["TargetTrackingScalingPolicyConfiguration"][
                     "PredefinedMetricSpecification"]["PredefinedMetricType"] == metric]
    return config


def test_target_tracking_on_invocations_per_instance_at_the_capacity_models_target(
    prod: dict[str, Any], fleet: FleetPlan,
) -> None:
    config = tracking(prod, "SageMakerVariantInvocationsPerInstance")
    assert config["TargetValue"] == fleet.target_invocations_per_instance_per_min
    # sustainable ÷ (1 + headroom), rounded down to a whole invocation per minute
    assert config["TargetValue"] == int(fleet.per_instance_invocations_per_min
                                        / (1 + fleet.headroom))
    assert (config["ScaleOutCooldown"], config["ScaleInCooldown"]) == (60, 600)


def test_high_resolution_concurrency_tracking_as_application_auto_scaling_accepts_it(
    prod: dict[str, Any], prod_capacity: LlmCapacity,
) -> None:
    """SageMaker Developer Guide, "Define a scaling policy"
    (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-add-code-define.html),
    section "Specify a high-resolution predefined metric (CloudWatch metrics:
    ConcurrentRequestsPerModel and ConcurrentRequestsPerCopy)": a variant's target-tracking
    configuration is a ``TargetValue`` and a ``PredefinedMetricSpecification`` whose
    ``PredefinedMetricType`` is ``SageMakerVariantConcurrentRequestsPerModelHighResolution``;
    ConcurrentRequestsPerModel is "the number of concurrent requests being received by a model
    container" (requests queued in the container and streams until their last token included),
    emitted every 10 seconds instead of every minute, so the policy scales out sooner and scales
    in at the standard metrics' pace. The target is therefore a number of requests per model,
    not a rate, and needs no customized metric."""
    capacity = prod_capacity
    config = tracking(prod, "SageMakerVariantConcurrentRequestsPerModelHighResolution")
    assert set(config) == {"PredefinedMetricSpecification", "TargetValue", "ScaleInCooldown",
                           "ScaleOutCooldown"}
    assert config["PredefinedMetricSpecification"] == {
        "PredefinedMetricType": "SageMakerVariantConcurrentRequestsPerModelHighResolution"}
    assert config["TargetValue"] == capacity.fleet.target_concurrent_requests_per_model
    # the concurrency one instance holds at the SLO, less the same headroom as the rate target
    assert config["TargetValue"] == round(capacity.instance.concurrency
                                          / (1 + capacity.fleet.headroom), 1)
    assert 0 < config["TargetValue"] < capacity.instance.concurrency
    # Both policies act on the one scalable target of the variant ("ScalingTargetId"), each on a
    # different metric: Application Auto Scaling User Guide, "Target tracking scaling policies
    # for Application Auto Scaling"
    # (https://docs.aws.amazon.com/autoscaling/application/userguide/application-auto-scaling-target-tracking.html):
    # several target-tracking policies per scalable target are allowed "provided that each of
    # them uses a different metric", and the one giving the largest capacity wins for scale-out
    # and scale-in alike (the simulator's rule, tools/scaling_sim/engine.py _voters).
    policies = [r["Properties"] for k, r in prod["Resources"].items()
                if r["Type"] == "AWS::ApplicationAutoScaling::ScalingPolicy"
                and k.startswith("LlmScaling") and r["Properties"]["PolicyType"] ==
                "TargetTrackingScaling"]
    assert len(policies) == 2
    assert len({json.dumps(p["ScalingTargetId"]) for p in policies}) == 1
    metrics = [p["TargetTrackingScalingPolicyConfiguration"]["PredefinedMetricSpecification"]
               ["PredefinedMetricType"] for p in policies]
    assert len(set(metrics)) == len(metrics)


def test_step_scaling_adds_2_4_8_by_band(prod: dict[str, Any], fleet: FleetPlan) -> None:
    (policy,) = [r["Properties"] for k, r in prod["Resources"].items()
                 if r["Type"] == "AWS::ApplicationAutoScaling::ScalingPolicy"
                 and r["Properties"]["PolicyType"] == "StepScaling" and k.startswith("LlmScaling")]
    config = policy["StepScalingPolicyConfiguration"]
    assert config["AdjustmentType"] == "ChangeInCapacity"
    assert config["Cooldown"] == 300  # ≈ the provisioning delay (docs/scaling.md)
    steps = sorted((s["MetricIntervalLowerBound"], s.get("MetricIntervalUpperBound"),
                    s["ScalingAdjustment"]) for s in config["StepAdjustments"])
    # Bounds are relative to the alarm threshold (the target): +2 up to 2×, +4 to 4×, +8 beyond.
    threshold = fleet.step_threshold_invocations_per_instance_per_min
    assert threshold == fleet.target_invocations_per_instance_per_min
    assert steps == [(0, threshold, 2), (threshold, 3 * threshold, 4), (3 * threshold, None, 8)]


def test_step_alarm_is_one_minute_invocations_per_instance(prod: dict[str, Any],
                                                           fleet: FleetPlan) -> None:
    alarms = [a["Properties"] for a in resources(prod, "AWS::CloudWatch::Alarm").values()
              if a["Properties"].get("MetricName") == "InvocationsPerInstance"
              and {"Name": "EndpointName", "Value": "manga-assist-prod-llm"}
              in a["Properties"]["Dimensions"]]
    (alarm,) = alarms
    assert alarm["Namespace"] == "AWS/SageMaker"
    assert alarm["Period"] == 60 and alarm["EvaluationPeriods"] == 1
    assert alarm["Statistic"] == "Sum"
    assert alarm["Threshold"] == fleet.step_threshold_invocations_per_instance_per_min
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert sorted(d["Name"] for d in alarm["Dimensions"]) == ["EndpointName", "VariantName"]


def scheduled(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    actions = scalable_target(template)["Properties"]["ScheduledActions"]
    return {a["ScheduledActionName"]: a for a in actions}


def test_daily_floors_in_tokyo_time_with_minutes(prod: dict[str, Any], fleet: FleetPlan) -> None:
    actions = scheduled(prod)
    off_peak, business = actions["floor-off-peak"], actions["floor-business-hours"]
    assert off_peak["Schedule"] == "cron(0 1 * * ? *)"
    assert off_peak["ScalableTargetAction"] == {"MinCapacity": fleet.off_peak.min_capacity,
                                                "MaxCapacity": fleet.off_peak.max_capacity}
    assert business["Schedule"] == "cron(0 8 * * ? *)"
    assert business["ScalableTargetAction"] == {
        "MinCapacity": fleet.business_hours.min_capacity, "MaxCapacity": fleet.max_capacity}
    for action in actions.values():
        assert action["Timezone"] == "Asia/Tokyo"
        minute = action["Schedule"].removeprefix("cron(").split()[0]
        assert minute.isdigit(), f"{action['ScheduledActionName']}: minute must be set"


def test_every_calendar_prescale_has_its_restore(prod: dict[str, Any]) -> None:
    names = set(scheduled(prod))
    prescales = {n.removesuffix("-prescale") for n in names if n.endswith("-prescale")}
    restores = {n.removesuffix("-restore") for n in names if n.endswith("-restore")}
    assert prescales, "the prod calendar should add pre-scales"
    assert prescales == restores


def test_weekly_releases_prescale_two_hours_ahead_to_the_computed_capacity(
    prod: dict[str, Any], fleet: FleetPlan,
) -> None:
    actions = scheduled(prod)
    jump = actions["calendar-weekly-shonen-jump-prescale"]
    assert jump["Schedule"] == "cron(0 16 ? * MON *)"  # 18:00 release − 2 h lead
    # ceil(busiest hour × 2.0 ÷ sustainable × (1 + headroom)); max stays at the target's own.
    needed = math.ceil(fleet.release_base_invocations_per_min * 2.0
                       / fleet.per_instance_invocations_per_min * (1 + fleet.headroom))
    assert jump["ScalableTargetAction"] == {"MinCapacity": needed,
                                            "MaxCapacity": fleet.max_capacity}
    friday = actions["calendar-weekly-friday-release-window-prescale"]
    assert friday["Schedule"] == "cron(0 16 ? * FRI *)"
    assert actions["calendar-weekly-friday-release-window-restore"]["Schedule"] == (
        "cron(0 22 ? * FRI *)")


def test_synthesized_actions_are_exactly_the_calendar_expansion(prod: dict[str, Any],
                                                                 fleet: FleetPlan) -> None:
    text = (REPO_ROOT / "config" / "release_calendar.yaml").read_text()
    plan = build_static_schedule(text, {"llm": fleet.calendar_model()})
    expected = {a.name: (a.schedule, a.min_capacity, a.max_capacity) for a in plan.for_target("llm")}
    got = {n: (a["Schedule"], a["ScalableTargetAction"]["MinCapacity"],
               a["ScalableTargetAction"]["MaxCapacity"]) for n, a in scheduled(prod).items()}
    assert got == expected
    for schedule, _, _ in got.values():
        parse_schedule(schedule)  # valid Application Auto Scaling expressions
    assert len(got) <= 200


def test_dev_has_floors_only_and_no_calendar_lambda(dev: dict[str, Any]) -> None:
    assert set(scheduled(dev)) == {"floor-off-peak", "floor-business-hours"}
    functions = resources(dev, "AWS::Lambda::Function").values()
    assert not functions or all("ReleaseCalendar" not in json.dumps(f) for f in functions)
    assert not resources(dev, "AWS::SSM::Parameter")


def calendar_function(template: dict[str, Any]) -> dict[str, Any]:
    (function,) = [f for f in resources(template, "AWS::Lambda::Function").values()
                   if f["Properties"].get("Handler") == "lambdas/release_calendar/handler.handler"]
    return function["Properties"]


def test_calendar_lambda_configuration(prod: dict[str, Any], fleet: FleetPlan) -> None:
    function = calendar_function(prod)
    env = function["Environment"]["Variables"]
    assert env["SCALABLE_TARGET_LLM"] == RESOURCE_ID["Prod"]
    assert env["HORIZON_DAYS"] == "14" and env["ENVIRONMENT"] == "prod"
    assert env["DRY_RUN"] == "false"
    models = json.loads(env["CALENDAR_CAPACITY_MODELS"])
    assert models["llm"]["base_invocations_per_min"] == fleet.release_base_invocations_per_min
    assert models["llm"]["per_instance_invocations_per_min"] == (
        fleet.per_instance_invocations_per_min)
    assert models["llm"]["headroom"] == fleet.headroom
    assert models["llm"]["business_hours"]["start"] == "08:00"
    assert function["Runtime"].startswith("python3.")
    assert "ReservedConcurrentExecutions" not in function  # deploys in small accounts too
    # The calendar travels as JSON in an SSM parameter the function reads.
    (parameter,) = resources(prod, "AWS::SSM::Parameter").values()
    calendar = json.loads(parameter["Properties"]["Value"])
    assert {e["id"] for e in calendar["dated"]} == {"one-piece-ch1100"}


def test_calendar_lambda_runs_daily_and_after_each_deploy(prod: dict[str, Any]) -> None:
    rules = [r["Properties"] for k, r in prod["Resources"].items()
             if r["Type"] == "AWS::Events::Rule" and k.startswith("ReleaseCalendar")]
    schedules = [r["ScheduleExpression"] for r in rules if "ScheduleExpression" in r]
    assert schedules == ["cron(5 15 * * ? *)"]  # 00:05 JST
    (deploy,) = [r["EventPattern"] for r in rules if "EventPattern" in r]
    assert deploy["source"] == ["aws.cloudformation"]
    assert deploy["detail-type"] == ["CloudFormation Stack Status Change"]
    assert deploy["detail"]["stack-id"] == [{"Ref": "AWS::StackId"}]


def test_calendar_lambda_role_is_scoped(prod: dict[str, Any]) -> None:
    policies = [p["Properties"]["PolicyDocument"]["Statement"]
                for p in resources(prod, "AWS::IAM::Policy").values()
                if any("ReleaseCalendarRole" in r["Ref"] for r in p["Properties"]["Roles"])]
    (statements,) = policies
    actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str)
                                               else s["Action"])}
    assert {"application-autoscaling:PutScheduledAction",
            "application-autoscaling:DeleteScheduledAction", "ssm:GetParameter"} <= actions
    assert not [a for a in actions if a.endswith(":*")]
    assert not [a for a in actions if a.startswith(("sagemaker:", "iam:", "s3:"))]


def test_calendar_lambda_alarms(prod: dict[str, Any]) -> None:
    template = Template.from_json(prod)
    template.has_resource_properties("AWS::CloudWatch::Alarm", {
        "AlarmName": "manga-assist-prod-release-calendar-errors",
        "Namespace": "AWS/Lambda", "MetricName": "Errors",
        "Dimensions": [{"Name": "FunctionName", "Value": Match.any_value()}],
        "AlarmActions": Match.any_value(),
    })
    template.has_resource_properties("AWS::CloudWatch::Alarm", {
        "AlarmName": "manga-assist-prod-release-calendar-entries-skipped",
        "Namespace": "MangaAssist/Inference", "MetricName": "CalendarEntriesSkipped",
        "Dimensions": [{"Name": "Environment", "Value": "prod"}],
    })


def test_lambda_assets_hold_only_the_handler_and_shared_modules(synthesized) -> None:  # type: ignore[no-untyped-def]
    assembly = synthesized.outdir / "assembly-Prod"
    assets = json.loads(next(assembly.glob("ProdServing*.assets.json")).read_text())
    zips = [a["source"]["path"] for a in assets["files"].values()
            if a["source"].get("packaging") == "zip"]
    staged = {next((assembly / path / "lambdas").iterdir()).name: assembly / path
              for path in zips if (assembly / path / "lambdas").is_dir()}
    assert sorted(staged) == ["release_calendar", "scaling_limits"]
    assert sorted(p.name for p in staged["release_calendar"].iterdir()) == [
        "lambdas", "metrics_contract", "release_calendar", "request_buckets"]
    assert sorted(p.name for p in staged["scaling_limits"].iterdir()) == [
        "lambdas", "metrics_contract", "request_buckets"]
    assert (staged["release_calendar"] / "lambdas" / "release_calendar" / "handler.py").is_file()
    assert (staged["scaling_limits"] / "lambdas" / "scaling_limits" / "handler.py").is_file()


@pytest.mark.parametrize("rule", ["Daily", "AfterDeploy"])
def test_rules_target_the_function_with_retries(prod: dict[str, Any], rule: str) -> None:
    rules = {k: r["Properties"] for k, r in prod["Resources"].items()
             if r["Type"] == "AWS::Events::Rule"}
    (props,) = [p for k, p in rules.items() if re.search(f"ReleaseCalendar{rule}", k)]
    (target,) = props["Targets"]
    assert target["RetryPolicy"]["MaximumRetryAttempts"] == 2
