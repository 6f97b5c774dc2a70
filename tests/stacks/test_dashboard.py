"""The environment dashboard (stacks/dashboard.py), read back from a synthesized template.

One small stack holds the dashboard for an LLM endpoint (prod settings, the real alarm rules) and
an intent endpoint on Inferentia, plus the release-calendar row for a real Lambda function. Its
``DashboardBody`` (an ``Fn::Join``) is rendered to JSON with every token replaced by a
placeholder, and checked against the metrics contract, the settings and the instance catalog.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk.assertions import Template

import metrics_contract as mc
from capacity_model import FleetPlan
from gpu_budget import PRICE_REGION, PRICES_COMPILED_ON, instance_type
from intents import INTENT_LABELS
from stacks.alarm_rules import (
    INSTANCE_COUNT_EXPRESSION,
    calendar_lambda_rules,
    intent_alarm_rules,
    llm_alarm_rules,
)
from stacks.alarms import AlarmSet, EndpointAlarms
from stacks.dashboard import DashboardEndpoint, InferenceDashboard, dashboard_metric
from stacks.settings import EndpointAlarmSettings, Environment, EnvironmentSettings

LLM_TITLE = "LLM (vLLM on ml.g5.xlarge)"
INTENT_TITLE = "Intent (DistilBERT on ml.inf1.xlarge)"
LLM_ENDPOINT = "manga-assist-prod-llm"
INTENT_ENDPOINT = "manga-assist-prod-intent"
VARIANT = "AllTraffic"
INTENT_INSTANCE = "ml.inf1.xlarge"
CONTRACT = {(spec.namespace, spec.name): spec for spec in mc.ALL_METRICS}

# What issue 9 asks each section to show (title fragments, matched case-insensitively).
COMMON_WIDGETS = ("ModelLatency", "Invocations and errors", "Instances vs schedule",
                  "Invocations per instance vs scaling target", "Estimated cost", "Alarms")
LLM_WIDGETS = ("GPU memory", "GPU utilization", "KV-cache usage", "Running and waiting requests",
               "Time to first token", "Time per output token", "request latency",
               "OOM circuit trips", "fallbacks",
               "Circuit breaker state", "Admission rejections by bucket", *COMMON_WIDGETS)
INTENT_WIDGETS = ("Intent classification latency", "Intent predictions by intent",
                  *COMMON_WIDGETS)
LLM_ONLY = ("KV-cache usage", "Circuit breaker state", "Admission rejections",
            "Time to first token", "Time per output token", "OOM circuit trips", "GPU memory")


# --- rendering the body ------------------------------------------------------------------------
def render_body(dashboard_body: Any) -> dict[str, Any]:
    """The DashboardBody as JSON: literal parts joined, each token as ``TOKEN[<its JSON>]``."""
    if isinstance(dashboard_body, str):
        return json.loads(dashboard_body)
    separator, parts = dashboard_body["Fn::Join"]
    text = separator.join(
        part if isinstance(part, str)
        else "TOKEN[" + json.dumps(part, sort_keys=True).replace('"', "'") + "]"
        for part in parts
    )
    return json.loads(text)


def token(reference: dict[str, Any]) -> str:
    """The placeholder :func:`render_body` writes for a CloudFormation reference."""
    return "TOKEN[" + json.dumps(reference, sort_keys=True).replace('"', "'") + "]"


@dataclass(frozen=True)
class MetricRow:
    """One entry of a metric widget's ``metrics`` list."""

    widget: str
    namespace: str | None
    name: str | None
    dimensions: dict[str, str]
    options: dict[str, Any]

    @property
    def expression(self) -> str | None:
        return self.options.get("expression")

    @property
    def stat(self) -> str:
        return str(self.options.get("stat", "Average"))  # CDK omits the default


def metric_rows(widget: dict[str, Any]) -> list[MetricRow]:
    """Parse a metric widget's rows, expanding CloudWatch's ``"."`` (same as the row above)."""
    rows: list[MetricRow] = []
    previous: list[Any] = []
    title = widget["properties"].get("title", "")
    for raw in widget["properties"].get("metrics", []):
        if raw and isinstance(raw[-1], dict):
            options, items = raw[-1], list(raw[:-1])
        else:
            options, items = {}, list(raw)
        if not items:  # a math expression: only the options object
            rows.append(MetricRow(title, None, None, {}, options))
            continue
        items = [previous[i] if item == "." and i < len(previous) else item
                 for i, item in enumerate(items)]
        previous = items
        namespace, name, *pairs = items
        dimensions = dict(zip(pairs[0::2], pairs[1::2], strict=True))
        rows.append(MetricRow(title, namespace, name, dimensions, options))
    return rows


def all_rows(body: dict[str, Any]) -> Iterator[MetricRow]:
    for widget in body["widgets"]:
        if widget["type"] == "metric":
            yield from metric_rows(widget)


def metric_problems(body: dict[str, Any]) -> list[str]:
    """Every metric that is not the contract's, with other dimensions, or an expression that
    reads an id no row of its widget defines."""
    problems: list[str] = []
    for widget in body["widgets"]:
        if widget["type"] != "metric":
            continue
        rows = metric_rows(widget)
        ids = {row.options["id"] for row in rows if "id" in row.options}
        for row in rows:
            if row.expression is not None:
                used = set(re.findall(r"\b[a-z][A-Za-z0-9_]*\b", row.expression))
                if used - ids:
                    problems.append(f"{row.widget}: expression {row.expression!r} reads "
                                    f"undefined id(s) {sorted(used - ids)}")
                continue
            spec = CONTRACT.get((str(row.namespace), str(row.name)))
            if spec is None:
                problems.append(f"{row.widget}: {row.namespace}/{row.name} is not in the "
                                "metrics contract")
            elif set(row.dimensions) != set(spec.dimensions):
                problems.append(f"{row.widget}: {row.name} drawn with dimensions "
                                f"{sorted(row.dimensions)}, the contract publishes it with "
                                f"{sorted(spec.dimensions)}")
    return problems


FAILED_RUNS_QUEUE = "manga-assist-prod-release-calendar-failed-runs"

# --- the synthesized stack ----------------------------------------------------------------------
@dataclass(frozen=True)
class Built:
    body: dict[str, Any]
    template: dict[str, Any]
    settings: EnvironmentSettings
    fleet: FleetPlan
    stack: cdk.Stack
    llm_alarms: EndpointAlarms
    intent_alarms: EndpointAlarms
    calendar_alarms: AlarmSet
    function: lambda_.Function

    def widgets(self, title_prefix: str) -> list[dict[str, Any]]:
        return [w for w in self.body["widgets"]
                if w["properties"].get("title", "").startswith(f"{title_prefix} · ")]

    def widget(self, title_prefix: str, fragment: str) -> dict[str, Any]:
        found = [w for w in self.widgets(title_prefix)
                 if fragment.lower() in w["properties"]["title"].lower()]
        assert len(found) == 1, f"{title_prefix}: {len(found)} widgets match {fragment!r}"
        return found[0]


def build_alarms(scope: cdk.Stack, settings: EnvironmentSettings, fleet: FleetPlan
                 ) -> tuple[EndpointAlarms, EndpointAlarms, sns.Topic]:
    topic = sns.Topic(scope, "AlarmTopic")
    gpu_count = instance_type(settings.llm.instance_type).gpu_count
    llm_alarms = EndpointAlarms(
        scope, "LlmAlarms", endpoint_name=LLM_ENDPOINT, variant_name=VARIANT,
        rules=llm_alarm_rules(settings.llm.alarms, gpu_count=gpu_count,
                              max_capacity=settings.llm.scaling.max_capacity,
                              daily_minimum=max(f.min_capacity for f in fleet.floors)),
        alarm_topic=topic,
    )
    intent_alarms = EndpointAlarms(
        scope, "IntentAlarms", endpoint_name=INTENT_ENDPOINT, variant_name=VARIANT,
        rules=intent_alarm_rules(EndpointAlarmSettings(),
                                 max_capacity=settings.llm.scaling.max_capacity),
        alarm_topic=topic,
    )
    return llm_alarms, intent_alarms, topic


def endpoints(settings: EnvironmentSettings, fleet: FleetPlan, llm_alarms: EndpointAlarms,
              intent_alarms: EndpointAlarms) -> list[DashboardEndpoint]:
    return [
        DashboardEndpoint(title=LLM_TITLE, endpoint_name=LLM_ENDPOINT, variant_name=VARIANT,
                          kind="llm", instance_type=settings.llm.instance_type,
                          scaling=settings.llm.scaling, fleet=fleet,
                          alarms=llm_alarms, max_model_len=settings.llm.max_model_len),
        DashboardEndpoint(title=INTENT_TITLE, endpoint_name=INTENT_ENDPOINT,
                          variant_name=VARIANT, kind="intent", instance_type=INTENT_INSTANCE,
                          scaling=settings.llm.scaling, fleet=fleet,
                          alarms=intent_alarms),
    ]


@pytest.fixture(scope="module")
def built(prod_environment: Environment) -> Built:
    settings, fleet = prod_environment.settings, prod_environment.plans.llm_fleet
    app = cdk.App()
    stack = cdk.Stack(app, "DashboardTest",
                      env=cdk.Environment(account=settings.account, region=settings.region))
    llm_alarms, intent_alarms, topic = build_alarms(stack, settings, fleet)
    function = lambda_.Function(
        stack, "CalendarFunction", runtime=lambda_.Runtime.PYTHON_3_12,
        handler="index.handler", code=lambda_.Code.from_inline("def handler(event, context):\n"
                                                              "    return event\n"),
    )
    calendar_alarms = AlarmSet(
        stack, "CalendarAlarms", name_prefix=f"{settings.resource_prefix}-release-calendar",
        dimensions={"FunctionName": function.function_name, "Environment": settings.name,
                    "QueueName": FAILED_RUNS_QUEUE},
        rules=calendar_lambda_rules(), alarm_topic=topic,
    )
    InferenceDashboard(
        stack, "Dashboard", dashboard_name=f"{settings.resource_prefix}-inference",
        endpoints=endpoints(settings, fleet, llm_alarms, intent_alarms),
        calendar_function_name=function.function_name, calendar_environment=settings.name,
        calendar_alarms=calendar_alarms, calendar_failed_runs_queue_name=FAILED_RUNS_QUEUE,
    )
    template = Template.from_stack(stack).to_json()
    dashboards = [r for r in template["Resources"].values()
                  if r["Type"] == "AWS::CloudWatch::Dashboard"]
    assert len(dashboards) == 1
    return Built(body=render_body(dashboards[0]["Properties"]["DashboardBody"]),
                 template=template, settings=settings, fleet=fleet, stack=stack, llm_alarms=llm_alarms,
                 intent_alarms=intent_alarms, calendar_alarms=calendar_alarms,
                 function=function)


def annotations(widget: dict[str, Any]) -> dict[float, str]:
    return {float(a["value"]): a.get("label", "")
            for a in widget["properties"].get("annotations", {}).get("horizontal", [])}


# --- metrics come from the contract ------------------------------------------------------------
def test_every_metric_is_a_contract_metric_with_exactly_its_dimensions(built: Built) -> None:
    rows = list(all_rows(built.body))
    assert len([r for r in rows if r.expression is None]) > 60  # not vacuous
    assert metric_problems(built.body) == []


def test_the_check_catches_an_unknown_metric_wrong_dimensions_and_a_dangling_id(
    built: Built,
) -> None:
    body = copy.deepcopy(built.body)
    widget = next(w for w in body["widgets"] if w["type"] == "metric")
    widget["properties"]["metrics"] += [
        ["MangaAssist/Inference", "GpuMemoryUsed", "EndpointName", "x", "VariantName", "y"],
        ["MangaAssist/Inference", "KVCacheUsage", "EndpointName", "x"],
        [".", "Fallbacks", ".", "x", "Bucket", "S"],
        [{"expression": "fallbacks / requests", "label": "rate"}],
    ]
    problems = metric_problems(body)
    assert any("GpuMemoryUsed is not in the metrics contract" in p for p in problems)
    assert any("KVCacheUsage drawn with dimensions ['EndpointName']" in p for p in problems)
    assert any("Fallbacks drawn with dimensions ['Bucket', 'EndpointName']" in p
               for p in problems)
    assert any("undefined id(s) ['fallbacks', 'requests']" in p for p in problems)


def test_endpoint_metrics_carry_their_own_endpoint_and_variant(built: Built) -> None:
    for title, endpoint in ((LLM_TITLE, LLM_ENDPOINT), (INTENT_TITLE, INTENT_ENDPOINT)):
        rows = [r for w in built.widgets(title) if w["type"] == "metric"
                for r in metric_rows(w) if r.expression is None]
        assert rows
        assert {r.dimensions["EndpointName"] for r in rows} == {endpoint}
        assert {r.dimensions["VariantName"] for r in rows} == {VARIANT}


def test_a_metric_outside_the_contract_is_refused() -> None:
    dims = {"EndpointName": "e", "VariantName": "v"}
    made_up = mc.MetricSpec("GpuMemoryUsed", mc.Unit.PERCENT, "not emitted", mc.Emitter.GATEWAY)
    with pytest.raises(ValueError, match="'GpuMemoryUsed' is not in the contract"):
        dashboard_metric(made_up, dims, statistic="Maximum", label="x")
    altered = dataclasses.replace(mc.KV_CACHE_USAGE, unit=mc.Unit.COUNT)
    with pytest.raises(ValueError, match="differs from the contract"):
        dashboard_metric(altered, dims, statistic="Maximum", label="x")
    with pytest.raises(ValueError, match="published with dimensions"):
        dashboard_metric(mc.ADMISSION_REJECTIONS, dims, statistic="Sum", label="x")


# --- the widgets the issue lists -----------------------------------------------------------------
@pytest.mark.parametrize(("title", "expected"), [(LLM_TITLE, LLM_WIDGETS),
                                                 (INTENT_TITLE, INTENT_WIDGETS)])
def test_every_widget_the_issue_lists_is_present(built: Built, title: str,
                                                 expected: tuple[str, ...]) -> None:
    titles = [w["properties"]["title"].lower() for w in built.widgets(title)]
    missing = [fragment for fragment in expected
               if not any(fragment.lower() in t for t in titles)]
    assert missing == [], f"{title}: no widget for {missing}; have {titles}"


def test_the_intent_section_has_no_llm_only_widgets(built: Built) -> None:
    titles = [w["properties"]["title"].lower() for w in built.widgets(INTENT_TITLE)]
    assert not [f for f in LLM_ONLY if any(f.lower() in t for t in titles)]
    names = {r.name for w in built.widgets(INTENT_TITLE) if w["type"] == "metric"
             for r in metric_rows(w)}
    assert not names & {"KVCacheUsage", "BreakerState", "OOMCircuitTrips", "GPUMemoryUtilization"}
    assert {"CPUUtilization", "MemoryUtilization"} <= names  # Inferentia: host metrics instead


def test_latency_widgets_show_p50_p90_p99_and_label_their_units(built: Built) -> None:
    for fragment, metric_name, unit in (("Time to first token", "TimeToFirstToken", "ms"),
                                        ("Time per output token", "TimePerOutputToken", "ms"),
                                        ("request latency", "RequestLatency", "ms"),
                                        ("ModelLatency", "ModelLatency", "µs")):
        widget = built.widget(LLM_TITLE, fragment)
        rows = metric_rows(widget)
        assert [(r.name, r.stat) for r in rows] == [(metric_name, p)
                                                    for p in ("p50", "p90", "p99")]
        assert f"({unit})" in widget["properties"]["yAxis"]["left"]["label"]
        assert unit in widget["properties"]["title"]
    # The LLM pages on what users feel: the SLO lines are on TTFT and TPOT, none on ModelLatency
    # (it stays on the dashboard, a whole generation); the classifier's ModelLatency has its SLA.
    alarms = built.settings.llm.alarms
    assert "time-to-first-token-p99" in annotations(
        built.widget(LLM_TITLE, "Time to first token"))[alarms.time_to_first_token_p99_ms]
    assert "time-per-output-token-p99" in annotations(
        built.widget(LLM_TITLE, "Time per output token"))[alarms.time_per_output_token_p99_ms]
    assert annotations(built.widget(LLM_TITLE, "ModelLatency")) == {}
    intent_sla_us = EndpointAlarmSettings().latency_p99_sla_ms * 1000
    assert "model-latency-p99" in annotations(
        built.widget(INTENT_TITLE, "ModelLatency"))[intent_sla_us]
    intent = metric_rows(built.widget(INTENT_TITLE, "Intent classification latency"))
    assert [(r.name, r.stat) for r in intent] == [("IntentLatency", p)
                                                  for p in ("p50", "p90", "p99")]


def test_first_response_p999_is_drawn_beside_the_first_token_p99(built: Built) -> None:
    """Seed 001's P99.9 first response (both modes, at the alarm's 5-minute period) beside the
    first-token p99, with both alarm lines: 2 s (p99) and 5 s (p99.9)."""
    widget = built.widget(LLM_TITLE, "First response p99.9")
    rows = metric_rows(widget)
    assert [(r.name, r.stat, r.dimensions.get("Mode")) for r in rows] == [
        ("TimeToFirstToken", "p99", None),
        ("FirstResponseLatency", "p99.9", "streamed"),
        ("FirstResponseLatency", "p99.9", "whole")]
    assert [r.options.get("period", 300) for r in rows] == [60, 300, 300]  # CDK omits 300
    lines = annotations(widget)
    alarms = built.settings.llm.alarms
    assert alarms.first_response_p999_ms == 5000
    assert "first-response-p99.9" in lines[5000.0]
    assert "time-to-first-token-p99" in lines[alarms.time_to_first_token_p99_ms]
    assert "(ms)" in widget["properties"]["yAxis"]["left"]["label"]
    # beside the first-token widget: the next one in reading order
    titles = [w["properties"]["title"] for w in built.widgets(LLM_TITLE)]
    first_token = next(i for i, t in enumerate(titles) if "Time to first token" in t)
    assert "First response p99.9" in titles[first_token + 1]


def test_gpu_widgets_are_annotated_at_100_per_gpu_and_the_alarm(built: Built) -> None:
    gpus = instance_type(built.settings.llm.instance_type).gpu_count
    memory = annotations(built.widget(LLM_TITLE, "GPU memory"))
    assert 100.0 * gpus in memory and "100 %" in memory[100.0 * gpus]
    threshold = built.settings.llm.alarms.gpu_memory_percent * gpus
    assert "gpu-memory-utilization" in memory[threshold]
    assert 100.0 * gpus in annotations(built.widget(LLM_TITLE, "GPU utilization"))
    for fragment in ("GPU memory", "GPU utilization"):
        rows = metric_rows(built.widget(LLM_TITLE, fragment))
        assert {r.namespace for r in rows} == {"/aws/sagemaker/Endpoints"}


def test_kv_and_queue_widgets_draw_their_alarm_thresholds(built: Built) -> None:
    alarms = built.settings.llm.alarms
    kv = annotations(built.widget(LLM_TITLE, "KV-cache usage"))
    assert "kv-cache-usage-high" in kv[alarms.kv_cache_usage_percent]
    queue = annotations(built.widget(LLM_TITLE, "queue wait"))
    assert "queue-wait-p99" in queue[alarms.queue_wait_p99_ms]


def test_running_and_waiting_and_oom_widgets_draw_the_right_metrics(built: Built) -> None:
    running = {r.name for r in metric_rows(built.widget(LLM_TITLE, "Running and waiting"))}
    assert {"RunningRequests", "WaitingRequests"} <= running
    oom = {(r.name, r.stat) for r in metric_rows(built.widget(LLM_TITLE, "OOM circuit trips"))}
    assert {("OOMCircuitTrips", "Sum"), ("Fallbacks", "Sum"), ("EngineRestarts", "Sum")} <= oom


def test_breaker_state_has_a_legend_for_0_1_2(built: Built) -> None:
    widget = built.widget(LLM_TITLE, "Circuit breaker state")
    legend = annotations(widget)
    assert sorted(legend) == sorted(float(v) for v in mc.BREAKER_STATE_VALUES.values())
    assert "closed" in legend[0.0] and "half-open" in legend[1.0] and "open" in legend[2.0]
    assert widget["properties"]["yAxis"]["left"]["max"] == 2
    assert [(r.name, r.stat) for r in metric_rows(widget)] == [("BreakerState", "Maximum")]


def test_admission_rejections_one_metric_per_bucket(built: Built) -> None:
    rows = metric_rows(built.widget(LLM_TITLE, "Admission rejections by bucket"))
    assert [(r.name, r.dimensions["Bucket"]) for r in rows] == [
        ("AdmissionRejections", bucket) for bucket in ("S", "M", "L", "XL", "Unsized")]
    # Labelled with the ranges the gateway and the GPU budget use at prod's 4,096-token window.
    labels = [r.options.get("label") for r in rows]
    assert labels == ["AdmissionRejections S ≤ 512", "AdmissionRejections M 513–1,024",
                      "AdmissionRejections L 1,025–2,048", "AdmissionRejections XL 2,049–4,096",
                      "AdmissionRejections unsized (refused unparsed)"]


def test_an_llm_section_needs_the_context_window(built: Built) -> None:
    with pytest.raises(ValueError, match="an llm endpoint needs max_model_len"):
        DashboardEndpoint(title="x", endpoint_name="e", variant_name="v", kind="llm",
                          instance_type=built.settings.llm.instance_type,
                          scaling=built.settings.llm.scaling,
                          fleet=built.fleet, alarms=built.llm_alarms)


def test_intent_predictions_one_metric_per_intent_label(built: Built) -> None:
    rows = [r for r in metric_rows(built.widget(INTENT_TITLE, "Intent predictions"))
            if r.name == "IntentPredictions"]
    assert [r.dimensions["Intent"] for r in rows] == list(INTENT_LABELS)


# --- capacity, scaling target and cost ---------------------------------------------------------
def _math_widget(widget: dict[str, Any]) -> tuple[MetricRow, dict[str, MetricRow]]:
    rows = metric_rows(widget)
    expressions = [r for r in rows if r.expression is not None]
    assert len(expressions) == 1
    inputs = {r.options["id"]: r for r in rows if "id" in r.options}
    return expressions[0], inputs


@pytest.mark.parametrize("title", [LLM_TITLE, INTENT_TITLE])
def test_instances_vs_schedule_uses_the_alarm_expression_and_the_settings(
    built: Built, title: str,
) -> None:
    scaling = built.settings.llm.scaling
    fleet = built.fleet
    widget = built.widget(title, "Instances vs schedule")
    expression, inputs = _math_widget(widget)
    assert expression.expression == INSTANCE_COUNT_EXPRESSION
    assert {(k, r.name, r.stat) for k, r in inputs.items()} == {
        ("invocations", "Invocations", "Sum"), ("perinstance", "InvocationsPerInstance", "Sum")}
    assert all(r.options.get("visible") is False for r in inputs.values())
    lines = annotations(widget)
    assert "min capacity" in lines[scaling.min_capacity]
    assert "max capacity" in lines[scaling.max_capacity]
    # the capacity model's daily ranges, not numbers typed in the settings
    off_peak, business = fleet.off_peak, fleet.business_hours
    assert f"off-peak floor {off_peak.min_capacity}" in lines[off_peak.min_capacity]
    assert scaling.off_peak.start in lines[off_peak.min_capacity]
    assert f"business hours floor {business.min_capacity}" in lines[business.min_capacity]
    assert scaling.business_hours.start in lines[business.min_capacity]
    assert f"off-peak ceiling {off_peak.max_capacity}" in lines[off_peak.max_capacity]


@pytest.mark.parametrize(("title", "endpoint"), [(LLM_TITLE, LLM_ENDPOINT),
                                               (INTENT_TITLE, INTENT_ENDPOINT)])
def test_instances_vs_schedule_draws_the_range_in_force_the_alarm_compares_with(
    built: Built, title: str, endpoint: str,
) -> None:
    rows = {r.name: r for r in metric_rows(built.widget(title, "Instances vs schedule"))
            if r.namespace == "MangaAssist/Inference"}
    assert {(name, r.stat) for name, r in rows.items()} == {
        ("MaxCapacityInForce", "Maximum"), ("MinCapacityInForce", "Minimum")}
    assert all(r.dimensions == {"EndpointName": endpoint, "VariantName": VARIANT}
               for r in rows.values())


def test_invocations_per_instance_against_the_scaling_target(built: Built) -> None:
    fleet = built.fleet
    widget = built.widget(LLM_TITLE, "Invocations per instance vs scaling target")
    expression, inputs = _math_widget(widget)
    assert expression.expression == "perinstance / (PERIOD(perinstance) / 60)"
    assert (inputs["perinstance"].name, inputs["perinstance"].stat) == (
        "InvocationsPerInstance", "Sum")
    lines = annotations(widget)
    assert "target tracking" in lines[fleet.target_invocations_per_instance_per_min]
    assert "step scaling" in lines[fleet.step_threshold_invocations_per_instance_per_min]
    assert "sustainable" in lines[fleet.per_instance_invocations_per_min]


@pytest.mark.parametrize(("title", "instance"), [(LLM_TITLE, "ml.g5.xlarge"),
                                                 (INTENT_TITLE, INTENT_INSTANCE)])
def test_cost_per_hour_is_instances_times_the_catalog_price(built: Built, title: str,
                                                            instance: str) -> None:
    catalog = instance_type(instance)
    widget = built.widget(title, "Estimated cost")
    expression, inputs = _math_widget(widget)
    assert expression.expression is not None
    assert expression.expression.startswith(f"({INSTANCE_COUNT_EXPRESSION}) * ")
    price = float(expression.expression.rsplit("*", 1)[1])
    assert price == catalog.on_demand_usd_per_hour
    assert set(inputs) == {"invocations", "perinstance"}
    label = expression.options["label"]
    for fact in (PRICE_REGION, PRICES_COMPILED_ON, catalog.price_basis, "approximate",
                 f"${catalog.on_demand_usd_per_hour:.3f}"):
        assert fact in label, f"cost label lacks {fact!r}: {label}"
    scaling = built.settings.llm.scaling
    assert sorted(annotations(widget)) == pytest.approx(
        [scaling.min_capacity * price, scaling.max_capacity * price])


# --- alarms and the calendar row -----------------------------------------------------------------
@pytest.mark.parametrize("which", ["llm", "intent"])
def test_alarm_status_lists_every_alarm_of_the_endpoint(built: Built, which: str) -> None:
    alarms, title = ((built.llm_alarms, LLM_TITLE) if which == "llm"
                     else (built.intent_alarms, INTENT_TITLE))
    widget = built.widget(title, "Alarms")
    assert widget["type"] == "alarm"
    expected = [*alarms.alarms.values(), *([alarms.page_alarm] if alarms.page_alarm else [])]
    arns = {token(built.stack.resolve(alarm.alarm_arn)) for alarm in expected}
    assert set(widget["properties"]["alarms"]) == arns
    assert len(widget["properties"]["alarms"]) == len(expected)


def test_release_calendar_row_uses_the_function_and_environment(built: Built) -> None:
    widgets = [w for w in built.body["widgets"]
               if w["properties"].get("title", "").startswith("Release calendar")]
    rows = [r for w in widgets if w["type"] == "metric" for r in metric_rows(w)]
    by_name = {r.name: r for r in rows}
    assert set(by_name) == {"CalendarActionsCreated", "CalendarActionsUpdated",
                            "CalendarActionsDeleted", "CalendarEntriesSkipped", "Errors",
                            "ApproximateNumberOfMessagesVisible"}
    assert by_name["ApproximateNumberOfMessagesVisible"].namespace == "AWS/SQS"
    assert by_name["ApproximateNumberOfMessagesVisible"].dimensions == {
        "QueueName": FAILED_RUNS_QUEUE}
    function_ref = token(built.stack.resolve(built.function.function_name))
    assert by_name["Errors"].namespace == "AWS/Lambda"
    assert by_name["Errors"].dimensions == {"FunctionName": function_ref}
    for name in ("CalendarActionsCreated", "CalendarEntriesSkipped"):
        assert by_name[name].dimensions == {"Environment": built.settings.name}
    status = next(w for w in widgets if w["type"] == "alarm")
    assert len(status["properties"]["alarms"]) == len(built.calendar_alarms.alarms)


def test_dashboard_is_named_for_the_environment(built: Built) -> None:
    dashboards = [r for r in built.template["Resources"].values()
                  if r["Type"] == "AWS::CloudWatch::Dashboard"]
    assert dashboards[0]["Properties"]["DashboardName"] == "manga-assist-prod-inference"


# --- refusals ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def unsynthesized(prod_environment: Environment) -> tuple[cdk.Stack, list[DashboardEndpoint]]:
    """A second stack, never synthesized, for constructor refusals (cheap: no synth)."""
    settings, fleet = prod_environment.settings, prod_environment.plans.llm_fleet
    stack = cdk.Stack(cdk.App(), "Refusals")
    llm_alarms, intent_alarms, _topic = build_alarms(stack, settings, fleet)
    return stack, endpoints(settings, fleet, llm_alarms, intent_alarms)


def test_refuses_a_bad_dashboard_name(unsynthesized: tuple[cdk.Stack, list[Any]]) -> None:
    stack, eps = unsynthesized
    with pytest.raises(ValueError, match=r"dashboard_name 'prod inference!' is not accepted"):
        InferenceDashboard(stack, "BadName", dashboard_name="prod inference!", endpoints=eps)


def test_refuses_calendar_function_without_environment(
    unsynthesized: tuple[cdk.Stack, list[Any]],
) -> None:
    stack, eps = unsynthesized
    with pytest.raises(ValueError, match="calendar_environment None go together"):
        InferenceDashboard(stack, "NoEnv", dashboard_name="x", endpoints=eps,
                           calendar_function_name="fn")


def test_refuses_duplicate_titles_and_no_endpoints(
    unsynthesized: tuple[cdk.Stack, list[Any]],
) -> None:
    stack, eps = unsynthesized
    with pytest.raises(ValueError, match="is used twice"):
        InferenceDashboard(stack, "Twice", dashboard_name="x", endpoints=[eps[0], eps[0]])
    with pytest.raises(ValueError, match="endpoints is empty"):
        InferenceDashboard(stack, "None", dashboard_name="x", endpoints=[])


def test_refuses_an_llm_endpoint_without_gpu_and_an_unknown_kind(
    unsynthesized: tuple[cdk.Stack, list[Any]],
) -> None:
    _stack, eps = unsynthesized
    with pytest.raises(ValueError, match=r"'ml\.inf1\.xlarge' has no GPU"):
        dataclasses.replace(eps[0], instance_type="ml.inf1.xlarge")
    with pytest.raises(ValueError, match="kind 'tts' is not accepted; accepted: llm, intent"):
        dataclasses.replace(eps[0], kind="tts")
    with pytest.raises(ValueError, match="not in the catalog"):
        dataclasses.replace(eps[0], instance_type="ml.g99.xlarge")
