"""Reading scaling policies from CloudFormation: the hand-written fixture, and a template that
aws-cdk-lib really synthesized from the release-calendar expansion."""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from capacity_model import LlmCapacity
from release_calendar import (
    CapacityModel,
    DailyFloor,
    build_static_schedule,
    capacity_models_from_json,
)
from tools.scaling_sim.template import TemplateError, load_template, scaling_setup

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "scaling_sim_fixtures" / "scaling.template.json"
CALENDAR = REPO_ROOT / "config" / "release_calendar.yaml"


@pytest.fixture
def template() -> dict[str, Any]:
    return load_template(FIXTURE)


def test_fixture_actions_are_what_the_calendar_expands_to(template: dict[str, Any]) -> None:
    resources = template["Resources"]
    models = capacity_models_from_json(resources["ReleaseCalendarFunction"]["Properties"]
                                       ["Environment"]["Variables"]["CALENDAR_CAPACITY_MODELS"])
    plan = build_static_schedule(CALENDAR.read_text(encoding="utf-8"), models)
    for target, logical_id in (("llm", "LlmScalingTarget"), ("intent", "IntentScalingTarget")):
        written = resources[logical_id]["Properties"]["ScheduledActions"]
        expected = [{"ScalableTargetAction": {"MaxCapacity": a.max_capacity,
                                              "MinCapacity": a.min_capacity},
                     "Schedule": a.schedule, "ScheduledActionName": a.name,
                     "Timezone": a.timezone} for a in plan.for_target(target)]
        assert written == expected, f"regenerate the fixture's {logical_id} ScheduledActions"


def test_llm_target_is_found_through_the_lambda_environment(template: dict[str, Any]) -> None:
    setup = scaling_setup(template)
    assert setup.logical_id == "LlmScalingTarget"
    assert setup.calendar_target == "llm"
    assert (setup.min_capacity, setup.max_capacity) == (2, 20)
    assert len(setup.scheduled) == 12
    [tracking] = setup.target_tracking
    assert (tracking.target_value, tracking.scale_out_cooldown_s,
            tracking.scale_in_cooldown_s) == (200.0, 60, 600)
    [step] = setup.step
    assert step.alarm.threshold == 300
    assert step.alarm.period_s == 60
    assert [(s.lower, s.upper, s.adjustment) for s in step.steps] == [
        (0.0, 200.0, 2), (200.0, 600.0, 4), (600.0, None, 8)]
    assert setup.capacity_models["llm"].base_invocations_per_min == 600


def test_another_target_can_be_chosen(template: dict[str, Any]) -> None:
    setup = scaling_setup(template, scalable_target="IntentScalingTarget")
    assert setup.calendar_target == "intent"
    assert setup.step == ()
    assert setup.target_tracking[0].target_value == 1200


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [(lambda r: r["LlmScalingTargetTracking"]["Properties"][
        "TargetTrackingScalingPolicyConfiguration"]["PredefinedMetricSpecification"].update(
        PredefinedMetricType="SageMakerVariantCPUUtilization"),
      "LlmScalingTargetTracking: target tracking on 'SageMakerVariantCPUUtilization'"),
     (lambda r: r["LlmStepScaleOutAlarm"]["Properties"].update(MetricName="CPUUtilization"),
      "LlmStepScaleOutAlarm: alarm on AWS/SageMaker/CPUUtilization is not modelled"),
     (lambda r: r["LlmStepScaleOutAlarm"]["Properties"].update(AlarmActions=[]),
      "LlmStepScaleOutPolicy: step scaling needs exactly one alarm"),
     (lambda r: r["LlmScalingTarget"]["Properties"]["ScheduledActions"][0].update(
         Schedule="rate(1 hour)"), "rate() depends on when the action was created"),
     (lambda r: r.pop("ReleaseCalendarFunction"), "2 scalable targets")],
)
def test_unsupported_templates_are_refused_by_name(template: dict[str, Any], edit: Any,
                                                   fragment: str) -> None:
    broken = copy.deepcopy(template)
    edit(broken["Resources"])
    with pytest.raises(TemplateError) as caught:
        scaling_setup(broken)
    assert fragment in str(caught.value)


def test_unknown_logical_id(template: dict[str, Any]) -> None:
    with pytest.raises(TemplateError, match="no scalable target 'Nope'; the template has "
                                            "IntentScalingTarget, LlmScalingTarget"):
        scaling_setup(template, scalable_target="Nope")


def test_reads_a_template_cdk_synthesized(tmp_path: Path) -> None:
    """The stack's way to wire the expansion, synthesized for real and read back."""
    import aws_cdk as cdk
    from aws_cdk import aws_applicationautoscaling as appscaling
    from aws_cdk import aws_cloudwatch as cloudwatch

    model = CapacityModel(base_invocations_per_min=600, per_instance_invocations_per_min=200,
                          headroom=0.3, min_capacity=2, max_capacity=20, timezone="Asia/Tokyo",
                          off_peak=DailyFloor("off-peak", dt.time(1), 2, 6),
                          business_hours=DailyFloor("business-hours", dt.time(8), 4, 20))
    plan = build_static_schedule(CALENDAR.read_text(encoding="utf-8"), {"llm": model})
    app = cdk.App(outdir=str(tmp_path))
    stack = cdk.Stack(app, "ScalingProbe",
                      env=cdk.Environment(account="123456789012", region="ap-northeast-1"))
    target = appscaling.ScalableTarget(
        stack, "LlmTarget", service_namespace=appscaling.ServiceNamespace.SAGEMAKER,
        resource_id="endpoint/mangaassist-llm-dev/variant/AllTraffic",
        scalable_dimension="sagemaker:variant:DesiredInstanceCount", min_capacity=2,
        max_capacity=20)
    target.scale_to_track_metric(
        "Tracking", target_value=200,
        predefined_metric=appscaling.PredefinedMetric.SAGEMAKER_VARIANT_INVOCATIONS_PER_INSTANCE,
        scale_in_cooldown=cdk.Duration.seconds(600), scale_out_cooldown=cdk.Duration.seconds(60))
    target.scale_on_metric(
        "Step", metric=cloudwatch.Metric(
            namespace="AWS/SageMaker", metric_name="InvocationsPerInstance", statistic="Sum",
            period=cdk.Duration.minutes(1),
            dimensions_map={"EndpointName": "mangaassist-llm-dev", "VariantName": "AllTraffic"}),
        scaling_steps=[appscaling.ScalingInterval(upper=300, change=0),
                       appscaling.ScalingInterval(lower=300, change=2),
                       appscaling.ScalingInterval(lower=500, change=4),
                       appscaling.ScalingInterval(lower=900, change=8)],
        adjustment_type=appscaling.AdjustmentType.CHANGE_IN_CAPACITY,
        cooldown=cdk.Duration.seconds(60), evaluation_periods=1)
    for action in plan.for_target("llm"):
        target.scale_on_schedule(
            action.name, schedule=appscaling.Schedule.expression(action.schedule),
            time_zone=cdk.TimeZone.of(action.timezone), min_capacity=action.min_capacity,
            max_capacity=action.max_capacity)
    app.synth()
    synthesized = json.loads((tmp_path / "ScalingProbe.template.json").read_text())
    setup = scaling_setup(synthesized)
    assert {a.name for a in setup.scheduled} == {a.name for a in plan.for_target("llm")}
    assert {(a.name, a.schedule.expression, a.timezone, a.min_capacity, a.max_capacity)
            for a in setup.scheduled} == {
        (a.name, a.schedule, a.timezone, a.min_capacity, a.max_capacity)
        for a in plan.for_target("llm")}
    assert setup.target_tracking[0].target_value == 200
    [step] = setup.step
    assert step.alarm.threshold == 300
    assert [(s.lower, s.upper, s.adjustment) for s in step.steps] == [
        (0.0, 200.0, 2), (200.0, 600.0, 4), (600.0, None, 8)]


def test_reads_the_capacity_models_figures_and_both_tracking_policies(  # type: ignore[no-untyped-def]
        synthesized, prod_capacity: LlmCapacity) -> None:
    """Production as synthesized: the scalable target's metadata carries what one instance
    sustains (and at what concurrency, for how long per request), the variant's instance type
    comes from its endpoint configuration, and both target-tracking policies are read."""
    from tools.scaling_sim.template import CONCURRENCY_HIGH_RESOLUTION, INVOCATIONS_PER_INSTANCE

    capacity = prod_capacity
    template = synthesized.template("Prod/Serving")
    setup = scaling_setup(template, calendar_target="llm")
    assert setup.capacity is not None
    assert setup.capacity.invocations_per_min == capacity.fleet.per_instance_invocations_per_min
    assert setup.capacity.concurrency == capacity.instance.concurrency
    assert setup.capacity.request_seconds == capacity.instance.request_seconds
    assert setup.capacity.headroom == capacity.fleet.headroom
    assert setup.instance_type == "ml.g5.xlarge"
    targets = {p.metric: p.target_value for p in setup.target_tracking}
    assert targets == {
        INVOCATIONS_PER_INSTANCE: capacity.fleet.target_invocations_per_instance_per_min,
        CONCURRENCY_HIGH_RESOLUTION: capacity.fleet.target_concurrent_requests_per_model}
    intent = scaling_setup(template, calendar_target="intent")
    assert intent.instance_type == "ml.inf1.xlarge"
    assert intent.capacity is not None and intent.capacity.concurrency is None
