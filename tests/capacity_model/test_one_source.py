"""No consumer holds a capacity number of its own: each reads the capacity model's.

Every consumer the issue names — the gateway's bucket caps (and admission watermark, context
window) in the container environment, the target-tracking targets, the step alarm's threshold
and bands, the scheduled minima and maxima, the release calendar's pre-scales, the template
metadata the scaling simulator and the cost report read, the alarms and the dashboard — is
compared with the capacity model twice: for production as shipped, and for production with
every input of the model moved (slower decoding, a tighter stream SLO, a bigger surge to
absorb, twice the traffic). A consumer that kept a number of its own, typed or defaulted, would
match the model once at most; here it must match both times, and the two must differ.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
import yaml

from capacity_model import FleetPlan, LlmCapacity
from stacks.settings import (
    REPO_ROOT,
    Environment,
    ScalingSettings,
    parse_environment,
    parse_settings,
)
from stacks.stage import MangaAssistStage
from stacks.synth import feature_flags
from tests.conftest import read_assembly
from tests.support.templates import properties, resources
from tools.scaling_sim.__main__ import simulation_params
from tools.scaling_sim.engine import SimulationParams
from tools.scaling_sim.template import INVOCATIONS_PER_INSTANCE, scaling_setup

GATEWAY_DEFAULT_CAPS = "S=128,M=64,L=32,XL=8"


def moved_prod() -> dict[str, Any]:
    """Production's settings with every capacity-model input changed."""
    data = yaml.safe_load((REPO_ROOT / "config" / "prod.yaml").read_text(encoding="utf-8"))
    llm = data["llm"]
    llm["alarms"] = {"time_per_output_token_p99_ms": 70, "time_to_first_token_p99_ms": 1500}
    llm["capacity"]["admission_watermark"] = 0.8
    llm["capacity"]["request_mix"]["XL"]["share"] = 0.25
    llm["capacity"]["request_mix"]["M"]["share"] = 0.35
    llm["capacity"]["rates"] = {"scenario": "optimistic"}
    llm["capacity"]["conversation"]["think_time_s"] = 90
    scaling = llm["scaling"]
    scaling["unplanned_surge"] = {"multiplier": 2.0, "rise_min": 15}
    scaling["provisioning_delay_s"] = 480
    scaling["traffic"]["hourly_invocations_per_min"] = [
        2 * v for v in scaling["traffic"]["hourly_invocations_per_min"]]
    data["intent"]["capacity"]["per_instance_invocations_per_min"] = 1200
    return data


@pytest.fixture(scope="module")
def variants(synthesized, prod_environment: Environment,  # type: ignore[no-untyped-def]
             tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, tuple[Environment, dict[str, Any]]]:
    """Production as shipped (the session's synthesis) and moved (synthesized here)."""
    moved = parse_environment(moved_prod(), source="prod (moved)")
    outdir = tmp_path_factory.mktemp("moved")
    app = cdk.App(outdir=str(outdir), context=feature_flags())
    MangaAssistStage(app, settings=moved.settings, plans=moved.plans)
    app.synth()
    return {"shipped": (prod_environment, synthesized.template("Prod/Serving")),
            "moved": (moved, read_assembly(Path(outdir)).template("Prod/Serving"))}


def llm_target(template: dict[str, Any]) -> dict[str, Any]:
    (target,) = resources(template, "AWS::ApplicationAutoScaling::ScalableTarget",
                          "LlmScaling").values()
    return target


def test_the_moved_inputs_move_every_derived_number(variants: dict[str, Any]) -> None:
    shipped = variants["shipped"][0].plans.llm_capacity
    moved = variants["moved"][0].plans.llm_capacity
    assert shipped.instance.gateway_bucket_caps() != moved.instance.gateway_bucket_caps()
    assert shipped.instance.sustainable_invocations_per_min != (
        moved.instance.sustainable_invocations_per_min)
    for field in ("headroom", "target_invocations_per_instance_per_min",
                  "target_concurrent_requests_per_model", "release_base_invocations_per_min"):
        assert getattr(shipped.fleet, field) != getattr(moved.fleet, field), field
    assert shipped.fleet.off_peak != moved.fleet.off_peak
    assert shipped.reuse.session_ttl_s != moved.reuse.session_ttl_s
    assert shipped.reuse.history_reuse != moved.reuse.history_reuse
    assert shipped.fleet.business_hours.min_capacity != moved.fleet.business_hours.min_capacity


@pytest.mark.parametrize("variant", ["shipped", "moved"])
def test_the_gateway_admits_what_the_model_sized(variants: dict[str, Any], variant: str) -> None:
    environment, template = variants[variant]
    settings = environment.settings
    capacity: LlmCapacity = environment.plans.llm_capacity
    (model,) = resources(template, "AWS::SageMaker::Model", "LlmEndpoint").values()
    env = model["Properties"]["PrimaryContainer"]["Environment"]
    assert env["GATEWAY_BUCKET_CAPS"] == capacity.instance.gateway_bucket_caps()
    assert env["GATEWAY_BUCKET_CAPS"] != GATEWAY_DEFAULT_CAPS
    assert env["GATEWAY_ADMISSION_WATERMARK"] == f"{settings.llm.capacity.admission_watermark:g}"
    assert env["GATEWAY_CONTEXT_SPLIT"] == capacity.window.as_env()
    assert env["GATEWAY_SESSION_TTL_S"] == str(capacity.reuse.session_ttl_s)


@pytest.mark.parametrize("variant", ["shipped", "moved"])
def test_scaling_numbers_are_the_fleet_plans(variants: dict[str, Any], variant: str) -> None:
    environment, template = variants[variant]
    fleet: FleetPlan = environment.plans.llm_fleet
    target = llm_target(template)
    policies = list(properties(template, "AWS::ApplicationAutoScaling::ScalingPolicy",
                               "LlmScaling").values())
    tracking = {p["TargetTrackingScalingPolicyConfiguration"]["PredefinedMetricSpecification"][
        "PredefinedMetricType"]: p["TargetTrackingScalingPolicyConfiguration"]["TargetValue"]
        for p in policies if p["PolicyType"] == "TargetTrackingScaling"}
    assert tracking == {
        INVOCATIONS_PER_INSTANCE: fleet.target_invocations_per_instance_per_min,
        "SageMakerVariantConcurrentRequestsPerModelHighResolution":
            fleet.target_concurrent_requests_per_model}
    (step,) = [p for p in policies if p["PolicyType"] == "StepScaling"]
    bounds = sorted((s["MetricIntervalLowerBound"], s.get("MetricIntervalUpperBound"),
                     s["ScalingAdjustment"])
                    for s in step["StepScalingPolicyConfiguration"]["StepAdjustments"])
    assert bounds == [tuple(i) for i in fleet.step_intervals]
    (alarm,) = properties(template, "AWS::CloudWatch::Alarm", "LlmScaling").values()
    assert alarm["Threshold"] == fleet.step_threshold_invocations_per_instance_per_min
    actions = {a["ScheduledActionName"]: a["ScalableTargetAction"]
               for a in target["Properties"]["ScheduledActions"]}
    for floor in fleet.floors:
        assert actions[f"floor-{floor.name}"] == {"MinCapacity": floor.min_capacity,
                                                  "MaxCapacity": floor.max_capacity}
    model = fleet.calendar_model()
    assert actions["calendar-weekly-shonen-jump-prescale"]["MinCapacity"] == min(
        model.required_instances(2.0), fleet.max_capacity)
    lambda_env = next(
        f["Properties"]["Environment"]["Variables"]
        for f in resources(template, "AWS::Lambda::Function", "ReleaseCalendar").values()
        if "CALENDAR_CAPACITY_MODELS" in f["Properties"].get("Environment", {}).get(
            "Variables", {}))
    assert json.loads(lambda_env["CALENDAR_CAPACITY_MODELS"])["llm"] == model.to_dict()


@pytest.mark.parametrize("variant", ["shipped", "moved"])
def test_the_simulator_and_the_cost_report_read_the_models_figures_from_the_template(
    variants: dict[str, Any], variant: str,
) -> None:
    environment, template = variants[variant]
    settings = environment.settings
    capacity = environment.plans.llm_capacity
    setup = scaling_setup(template, calendar_target="llm")
    params = simulation_params(setup, delay_min=6, capacity_override=None, instance_type=None,
                               usd_override=None)
    assert params.instance_capacity_per_min == capacity.fleet.per_instance_invocations_per_min
    assert params.concurrency_per_instance == capacity.instance.concurrency
    assert params.request_seconds == capacity.instance.request_seconds
    intent = scaling_setup(template, calendar_target="intent")
    assert simulation_params(intent, delay_min=6, capacity_override=None, instance_type=None,
                             usd_override=None).instance_capacity_per_min == (
        settings.intent.capacity.per_instance_invocations_per_min)


@pytest.mark.parametrize("variant", ["shipped", "moved"])
def test_the_alarms_and_the_dashboard_draw_the_models_numbers(variants: dict[str, Any],
                                                             variant: str) -> None:
    environment, template = variants[variant]
    settings = environment.settings
    fleet = environment.plans.llm_fleet
    alarms = {r["Properties"]["AlarmName"]: r["Properties"]
              for r in template["Resources"].values()
              if r["Type"] == "AWS::CloudWatch::Alarm" and "AlarmName" in r["Properties"]}
    rejections = alarms["manga-assist-prod-llm-release-window-rejections"]
    (expression,) = [m["Expression"] for m in rejections["Metrics"] if "Expression" in m]
    daily_minimum = max(floor.min_capacity for floor in fleet.floors)
    assert expression.startswith(f"IF(FILL(mininforce, 0) > {daily_minimum}, ")
    for name, threshold in (("time-to-first-token-p99",
                             settings.llm.alarms.time_to_first_token_p99_ms),
                            ("time-per-output-token-p99",
                             settings.llm.alarms.time_per_output_token_p99_ms)):
        assert alarms[f"manga-assist-prod-llm-{name}"]["Threshold"] == threshold
    (dashboard,) = [r["Properties"] for r in template["Resources"].values()
                    if r["Type"] == "AWS::CloudWatch::Dashboard"]
    body = json.dumps(dashboard["DashboardBody"])
    for label in (f"target tracking {fleet.target_invocations_per_instance_per_min:g}/min",
                  f"sustainable {fleet.per_instance_invocations_per_min:g}/min",
                  f"off-peak floor {fleet.off_peak.min_capacity}"):
        assert label in body, label


def test_nothing_else_can_hold_a_capacity_figure() -> None:
    """The settings have no field for one (a typed target is refused as an unknown key: see
    tests/stacks/test_settings.py), and the simulator has no default for one."""
    scaling_fields = set(ScalingSettings.model_fields)
    assert not {f for f in scaling_fields if f.startswith("target_") and f != "target_metric"}
    assert not [f for f in scaling_fields if "per_instance" in f]
    for window in ("off_peak", "business_hours"):
        window_model = ScalingSettings.model_fields[window].annotation
        assert set(window_model.model_fields) == {"start", "surge_allowance"}  # type: ignore[union-attr]
    required = {f.name for f in dataclasses.fields(SimulationParams)
                if f.default is dataclasses.MISSING}
    assert {"instance_capacity_per_min", "usd_per_instance_hour"} <= required
    prod = yaml.safe_load((REPO_ROOT / "config" / "prod.yaml").read_text(encoding="utf-8"))
    assert "per_instance_invocations_per_min" not in json.dumps(prod["llm"])
    assert "threshold_invocations_per_instance_per_min" not in json.dumps(prod)
    assert parse_settings(prod, source="prod").llm.scaling.release_calendar.enabled  # type: ignore[union-attr]
