"""Alarms as synthesized: what each watches, when it fires, whom it tells, and the contract."""

from __future__ import annotations

import json
from typing import Any

import pytest

import metrics_contract as mc
from stacks.alarm_rules import (
    GTE,
    LOCK_OUT_MINUTES,
    NOT_BREACHING,
    ROLLBACK_RULES,
    calendar_lambda_rules,
    intent_alarm_rules,
    llm_alarm_rules,
)
from stacks.alarms import RUNBOOK_BASE_URL, AlarmRule
from stacks.settings import EndpointAlarmSettings, Environment, load_settings

PREFIX = "manga-assist-prod-llm"
INTENT_PREFIX = "manga-assist-prod-intent"


@pytest.fixture(scope="module")
def alarms(prod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["Properties"]["AlarmName"]: r["Properties"] for r in prod["Resources"].values()
            if r["Type"] == "AWS::CloudWatch::Alarm" and "AlarmName" in r["Properties"]}


def topic_actions(alarm: dict[str, Any]) -> list[str]:
    return [json.dumps(a) for a in alarm.get("AlarmActions", [])]


# name suffix: (namespace, metric, statistic, threshold, period, comparison, missing data)
EXPECTED = {
    "invocation-5xx": ("AWS/SageMaker", "Invocation5XXErrors", "Sum", 1, 60,
                       "GreaterThanOrEqualToThreshold", "notBreaching"),
    "time-to-first-token-p99": ("MangaAssist/Inference", "TimeToFirstToken", "p99", 2000, 60,
                                "GreaterThanThreshold", "notBreaching"),
    "time-per-output-token-p99": ("MangaAssist/Inference", "TimePerOutputToken", "p99", 100,
                                  60, "GreaterThanThreshold", "notBreaching"),
    "oom-circuit-trips": ("MangaAssist/Inference", "OOMCircuitTrips", "Sum", 1, 60,
                          "GreaterThanOrEqualToThreshold", "notBreaching"),
    "engine-restarts": ("MangaAssist/Inference", "EngineRestarts", "Sum", 2, 3600,
                        "GreaterThanOrEqualToThreshold", "notBreaching"),
    "gpu-memory-utilization": ("/aws/sagemaker/Endpoints", "GPUMemoryUtilization", "Maximum",
                               98, 60, "GreaterThanOrEqualToThreshold", "missing"),
    "kv-cache-usage-high": ("MangaAssist/Inference", "KVCacheUsage", "Average", 90, 60,
                            "GreaterThanOrEqualToThreshold", "missing"),
    "queue-wait-p99": ("MangaAssist/Inference", "QueueWait", "p99", 150, 60,
                       "GreaterThanThreshold", "notBreaching"),
}


@pytest.mark.parametrize("suffix", sorted(EXPECTED))
def test_single_metric_alarm(alarms: dict[str, dict[str, Any]], suffix: str) -> None:
    namespace, metric, statistic, threshold, period, comparison, missing = EXPECTED[suffix]
    alarm = alarms[f"{PREFIX}-{suffix}"]
    assert alarm["Namespace"] == namespace
    assert alarm["MetricName"] == metric
    assert alarm.get("Statistic", alarm.get("ExtendedStatistic")) == statistic
    assert alarm["Threshold"] == threshold
    assert alarm["Period"] == period
    assert alarm["ComparisonOperator"] == comparison
    assert alarm["TreatMissingData"] == missing
    assert {d["Name"]: d["Value"] for d in alarm["Dimensions"]} == {
        "EndpointName": PREFIX, "VariantName": "AllTraffic"}
    assert f"{RUNBOOK_BASE_URL}/" in alarm["AlarmDescription"]


def test_first_response_p999_holds_seed_001s_five_seconds(
    alarms: dict[str, dict[str, Any]],
) -> None:
    """Seed 001: "P99.9 first-response latency < 5 s including worst-case warmup". The alarm
    reads the metric the gateway emits on the dimensions it emits it with (the request line's
    FirstResponseLatency, Mode streamed: tests/containers/llm/test_telemetry.py), at p99.9 —
    an extended statistic — over 5-minute periods, 2 of 3, and warns."""
    alarm = alarms[f"{PREFIX}-first-response-p99.9"]
    assert alarm["Namespace"] == mc.FIRST_RESPONSE_LATENCY.namespace == "MangaAssist/Inference"
    assert alarm["MetricName"] == mc.FIRST_RESPONSE_LATENCY.name == "FirstResponseLatency"
    # PutMetricAlarm: "When you call PutMetricAlarm and specify a MetricName, you must specify
    # either Statistic or ExtendedStatistic but not both", and a percentile such as p90 is an
    # extended statistic (Amazon CloudWatch API Reference, PutMetricAlarm, ExtendedStatistic:
    # https://docs.aws.amazon.com/AmazonCloudWatch/latest/APIReference/API_PutMetricAlarm.html;
    # percentiles pNN.NN: https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/
    # Statistics-definitions.html).
    assert alarm["ExtendedStatistic"] == "p99.9" and "Statistic" not in alarm
    assert alarm["Threshold"] == 5000
    assert load_settings("prod").llm.alarms.first_response_p999_ms == 5000
    assert alarm["ComparisonOperator"] == "GreaterThanThreshold"
    assert (alarm["Period"], alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]) == (300, 3, 2)
    assert alarm["TreatMissingData"] == "notBreaching"
    dimensions = {d["Name"]: d["Value"] for d in alarm["Dimensions"]}
    assert dimensions == {"EndpointName": PREFIX, "VariantName": "AllTraffic", "Mode": "streamed"}
    assert set(dimensions) == set(mc.FIRST_RESPONSE_LATENCY.dimensions)
    assert dimensions["Mode"] in (mc.FIRST_RESPONSE_LATENCY.values_of("Mode") or ())
    assert alarm["AlarmActions"], "a warning notifies the topic directly"
    assert f"{RUNBOOK_BASE_URL}/first-response-p999.md" in alarm["AlarmDescription"]


def test_model_latency_pages_for_the_classifier_only(alarms: dict[str, dict[str, Any]]) -> None:
    # The LLM's ModelLatency is a whole generation: it stays on the dashboard without an alarm.
    assert f"{PREFIX}-model-latency-p99" not in alarms
    intent = alarms[f"{INTENT_PREFIX}-model-latency-p99"]
    assert (intent["MetricName"], intent["ExtendedStatistic"]) == ("ModelLatency", "p99")
    assert intent["Threshold"] == load_settings("prod").intent.alarms.latency_p99_sla_ms * 1000


def test_llm_rollback_alarms_are_the_latency_slos_5xx_and_oom(prod: dict[str, Any]) -> None:
    (endpoint,) = [r["Properties"] for k, r in prod["Resources"].items()
                   if r["Type"] == "AWS::SageMaker::Endpoint" and k.startswith("LlmEndpoint")]
    names = {prod["Resources"][a["AlarmName"]["Ref"]]["Properties"]["AlarmName"]
             for a in endpoint["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]}
    assert names == {f"{PREFIX}-{rule}" for rule in ROLLBACK_RULES}
    assert {f"{PREFIX}-time-to-first-token-p99", f"{PREFIX}-time-per-output-token-p99"} <= names
    assert not [n for n in names if "model-latency" in n]
    # "Alarms ... Array Members: Minimum number of 1 item. Maximum number of 10 items."
    # (SageMaker API Reference, AutoRollbackConfig:
    # https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_AutoRollbackConfig.html)
    assert 1 <= len(names) <= 10


def test_release_window_rejections_is_a_ticket_in_release_windows_only(
    alarms: dict[str, dict[str, Any]], prod_environment: Environment,
) -> None:
    settings = prod_environment.settings
    fleet = prod_environment.plans.llm_fleet
    daily_minimum = max(floor.min_capacity for floor in fleet.floors)
    alarm = alarms[f"{PREFIX}-release-window-rejections"]
    (expression,) = [m for m in alarm["Metrics"] if "Expression" in m]
    assert expression["Expression"] == (
        f"IF(FILL(mininforce, 0) > {daily_minimum}, 100 * (FILL(sheds, 0) + FILL(shedm, 0) + "
        "FILL(shedl, 0) + FILL(shedxl, 0) + FILL(shedunsized, 0)) / invocations, 0)")
    stats = {m["Id"]: m["MetricStat"] for m in alarm["Metrics"] if "MetricStat" in m}
    assert {stat["Metric"]["MetricName"] for stat in stats.values()} == {
        "AdmissionRejections", "Invocations", "MinCapacityInForce"}
    assert {next(d["Value"] for d in stats[k]["Metric"]["Dimensions"] if d["Name"] == "Bucket")
            for k in ("sheds", "shedm", "shedl", "shedxl", "shedunsized")} == {
        "S", "M", "L", "XL", "Unsized"}
    assert alarm["Threshold"] == settings.llm.alarms.release_window_rejection_percent
    assert alarm["ComparisonOperator"] == "GreaterThanThreshold"
    assert alarm["TreatMissingData"] == "notBreaching"
    assert alarm["AlarmActions"], "a ticket notifies the topic directly, not through the page"
    assert "release-window-rejections.md" in alarm["AlarmDescription"]
    # PutMetricAlarm: "A single PutMetricAlarm call can include up to 20 MetricDataQuery
    # structures in the array. The 20 structures can include as many as 10 structures that
    # contain a MetricStat parameter ... and as many as 10 structures that contain the Expression
    # parameter" (Amazon CloudWatch API Reference, PutMetricAlarm, Metrics:
    # https://docs.aws.amazon.com/AmazonCloudWatch/latest/APIReference/API_PutMetricAlarm.html).
    assert len(stats) <= 10
    assert len(alarm["Metrics"]) - len(stats) <= 10
    assert len(alarm["Metrics"]) <= 20
    assert sum(1 for m in alarm["Metrics"] if m.get("ReturnData", True)) == 1


@pytest.mark.parametrize("alarm_name", ["release-window-rejections", "capacity-pinned-at-max",
                                        "fallback-rate"])
def test_every_metric_math_alarm_stays_within_cloudwatch_limits(
    alarms: dict[str, dict[str, Any]], alarm_name: str,
) -> None:
    # Same page as above: at most 10 MetricStat and 10 Expression structures per alarm, one of
    # the expressions returning data.
    alarm = alarms[f"{PREFIX}-{alarm_name}"]
    stats = [m for m in alarm["Metrics"] if "MetricStat" in m]
    expressions = [m for m in alarm["Metrics"] if "Expression" in m]
    assert 1 <= len(stats) <= 10 and 1 <= len(expressions) <= 10
    assert [m.get("ReturnData", True) for m in expressions].count(True) == 1
    assert not [m for m in stats if m.get("ReturnData") is not False]


def test_fallback_rate_is_a_ratio_of_contract_metrics(alarms: dict[str, dict[str, Any]]) -> None:
    alarm = alarms[f"{PREFIX}-fallback-rate"]
    expression = next(m for m in alarm["Metrics"] if "Expression" in m)
    assert expression["Expression"] == "IF(requests > 0, 100 * fallbacks / requests, 0)"
    inputs = {m["Id"]: m["MetricStat"]["Metric"]["MetricName"] for m in alarm["Metrics"]
              if "MetricStat" in m}
    assert inputs == {"fallbacks": "Fallbacks", "requests": "Requests"}
    assert alarm["Threshold"] == 5


@pytest.mark.parametrize(("prefix", "registered_max"), [(PREFIX, 30), (INTENT_PREFIX, 8)])
def test_capacity_pinned_compares_with_the_maximum_in_force(
    alarms: dict[str, dict[str, Any]], prefix: str, registered_max: int
) -> None:
    alarm = alarms[f"{prefix}-capacity-pinned-at-max"]
    assert alarm["EvaluationPeriods"] == 15 and alarm["DatapointsToAlarm"] == 15
    # instances − max in force ≥ −0.5, the max in force published by the scaling-limits Lambda;
    # the registered max only fills a window where that metric is missing.
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (
        -0.5, "GreaterThanOrEqualToThreshold")
    (expression,) = [m for m in alarm["Metrics"] if "Expression" in m]
    assert expression["Expression"] == (
        "(IF(perinstance > 0, invocations / perinstance, 0)) - "
        f"FILL(FILL(maxinforce, REPEAT), {registered_max})")
    inputs = {m["Id"]: m["MetricStat"] for m in alarm["Metrics"] if "MetricStat" in m}
    assert {k: v["Metric"]["MetricName"] for k, v in inputs.items()} == {
        "invocations": "Invocations", "perinstance": "InvocationsPerInstance",
        "maxinforce": "MaxCapacityInForce"}
    published = inputs["maxinforce"]
    assert published["Metric"]["Namespace"] == "MangaAssist/Inference"
    assert {d["Name"]: d["Value"] for d in published["Metric"]["Dimensions"]} == {
        "EndpointName": prefix, "VariantName": "AllTraffic"}
    assert published["Period"] == 60 and published["Stat"] == "Maximum"
    assert alarm["TreatMissingData"] == "notBreaching"  # no traffic: nothing is pinned


@pytest.mark.parametrize("prefix", [PREFIX, INTENT_PREFIX])
def test_a_missing_maximum_in_force_warns(alarms: dict[str, dict[str, Any]], prefix: str) -> None:
    """The failure is the metric's absence: "missing" data handling, and a notification on
    INSUFFICIENT_DATA — "if all data points in the alarm evaluation range are missing, the alarm
    transitions to INSUFFICIENT_DATA" (CloudWatch User Guide, "Configuring how CloudWatch alarms
    treat missing data",
    https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/alarms-and-missing-data.html)."""
    alarm = alarms[f"{prefix}-capacity-limits-missing"]
    assert (alarm["MetricName"], alarm["Statistic"]) == ("MaxCapacityInForce", "SampleCount")
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (1, "LessThanThreshold")
    assert alarm["TreatMissingData"] == "missing"
    assert alarm["Period"] * alarm["EvaluationPeriods"] == 900
    assert alarm["AlarmActions"], "a warning notifies the topic directly"
    assert alarm["InsufficientDataActions"] == alarm["AlarmActions"]


def depends_on(resource: dict[str, Any]) -> set[str]:
    value = resource.get("DependsOn", [])
    return {value} if isinstance(value, str) else set(value)


@pytest.mark.parametrize("environment", ["Dev", "Prod"])
def test_nothing_pages_during_the_first_deploy(synthesized: Any, environment: str) -> None:
    """The endpoints take up to their two start-up timeouts (2 x 1,200 s on g5) to be InService,
    and only then can Application Auto Scaling register their variants; until then the
    scaling-limits Lambda has nothing to publish. So:

    * no alarm watching the published maximum treats missing data as breaching: a new alarm is
      evaluated at once ("When this operation creates an alarm, the alarm state is immediately
      set to INSUFFICIENT_DATA. The alarm is then evaluated and its state is set appropriately.
      Any actions associated with the new state are then executed", CloudWatch API Reference,
      PutMetricAlarm), and three missing periods read as breaching would be ALARM at creation;
      with "missing" it stays INSUFFICIENT_DATA, which is no state change, and "the actions
      happen only on state transitions" (CloudWatch User Guide, "Alarm actions",
      https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/alarm-actions.html);
    * those alarms and the every-minute schedule are created after both scalable targets
      (DependsOn), so they start when the metric can exist.
    """
    template = synthesized.template(f"{environment}/Serving")
    resources = template["Resources"]
    targets = {k for k, r in resources.items()
               if r["Type"] == "AWS::ApplicationAutoScaling::ScalableTarget"}
    assert len(targets) == 2
    watching = {k: r for k, r in resources.items() if r["Type"] == "AWS::CloudWatch::Alarm"
                and "MaxCapacityInForce" in json.dumps(r["Properties"])}
    assert watching
    for logical_id, alarm in watching.items():
        missing = alarm["Properties"].get("TreatMissingData", "missing")
        assert missing != "breaching", logical_id
    limits = [k for k, r in watching.items()
              if r["Properties"]["AlarmName"].endswith("-capacity-limits-missing")]
    assert len(limits) == 2
    for logical_id in limits:
        own_target = [t for t in targets if t.split("Scaling")[0] == logical_id.split("Alarms")[0]]
        assert own_target and set(own_target) <= depends_on(resources[logical_id]), logical_id
    [schedule] = [k for k, r in resources.items() if r["Type"] == "AWS::Events::Rule"
                  and r["Properties"].get("ScheduleExpression") == "rate(1 minute)"]
    assert targets <= depends_on(resources[schedule])


def test_warnings_notify_the_topic_and_pages_go_through_the_composite(
    prod: dict[str, Any], alarms: dict[str, dict[str, Any]]
) -> None:
    rules = {r.name: r for r in llm_alarm_rules(EndpointAlarmSettings(), gpu_count=1,
                                                  max_capacity=20, daily_minimum=5)}
    for name, rule in rules.items():
        actions = topic_actions(alarms[f"{PREFIX}-{name}"])
        if rule.severity in ("warn", "ticket"):
            assert actions and all("AlarmTopicArn" in a or "Topic" in a for a in actions), name
        else:
            assert actions == [], f"{name} pages through the composite, not directly"
    (composite,) = [r["Properties"] for r in prod["Resources"].values()
                    if r["Type"] == "AWS::CloudWatch::CompositeAlarm"
                    and r["Properties"]["AlarmName"] == f"{PREFIX}-page"]
    assert composite["AlarmName"] == f"{PREFIX}-page"
    rule_text = json.dumps(composite["AlarmRule"])
    logical_ids = {r["Properties"]["AlarmName"]: k for k, r in prod["Resources"].items()
                   if r["Type"] == "AWS::CloudWatch::Alarm" and "AlarmName" in r["Properties"]}
    for name, rule in rules.items():
        in_composite = logical_ids[f"{PREFIX}-{name}"] in rule_text
        assert in_composite == (rule.severity == "page"), name
    assert composite["AlarmActions"]
    assert rule_text.count("ALARM(") == sum(r.severity == "page" for r in rules.values())


def all_rules() -> list[AlarmRule]:
    settings = load_settings("prod").llm
    return [
        *llm_alarm_rules(settings.alarms, gpu_count=1, max_capacity=20, daily_minimum=5),
        *intent_alarm_rules(settings.alarms, max_capacity=8),
        *calendar_lambda_rules(),
    ]


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.name)
def test_every_rule_watches_a_contract_metric(rule: AlarmRule) -> None:
    for spec in rule.watched_metrics:
        assert mc.metric(spec.name, spec.namespace) is spec


def test_custom_metrics_watched_are_emitted_by_our_code() -> None:
    watched = {spec for rule in all_rules() for spec in rule.watched_metrics if spec.is_custom}
    assert watched, "some alarms must watch the gateway's own metrics"
    assert all(spec.emitter in (mc.Emitter.GATEWAY, mc.Emitter.CLASSIFIER,
                                mc.Emitter.CALENDAR_LAMBDA, mc.Emitter.SCALING_LIMITS_LAMBDA)
               for spec in watched)


def test_a_rule_must_name_a_metric_or_an_expression() -> None:
    with pytest.raises(ValueError, match="set either metric or expression"):
        AlarmRule(name="x", threshold=1, comparison=None, period_s=60,  # type: ignore[arg-type]
                  evaluation_periods=1, datapoints_to_alarm=1, missing_data=None,  # type: ignore[arg-type]
                  severity="warn", meaning="m", runbook="r.md")


def test_contract_metric_refuses_a_spec_outside_the_contract() -> None:
    import dataclasses

    import aws_cdk as cdk

    from stacks.alarms import contract_metric

    dims = {"EndpointName": "e", "VariantName": "v"}
    made_up = dataclasses.replace(mc.FALLBACKS, name="Fallbackz")
    with pytest.raises(ValueError, match="'Fallbackz' is not in the contract"):
        contract_metric(made_up, dims, statistic="Sum", period=cdk.Duration.minutes(1))
    with pytest.raises(ValueError, match="differs from the contract"):
        contract_metric(dataclasses.replace(mc.FALLBACKS, unit=mc.Unit.PERCENT), dims,
                        statistic="Sum", period=cdk.Duration.minutes(1))


def alarm_fires(rule: AlarmRule, event_times_s: list[float], *, span_s: float) -> bool:
    """CloudWatch's M-of-N evaluation of a Sum ≥ threshold rule on events at ``event_times_s``:
    ``period_s`` buckets, missing periods not breaching (the rule's treatment), ALARM when any
    ``evaluation_periods`` consecutive periods hold ``datapoints_to_alarm`` breaching ones."""
    assert rule.statistic == "Sum" and rule.comparison is GTE
    assert rule.missing_data is NOT_BREACHING
    periods = int(span_s // rule.period_s) + 1
    sums = [0] * periods
    for moment in event_times_s:
        sums[int(moment // rule.period_s)] += 1
    breaching = [total >= rule.threshold for total in sums]
    return any(sum(breaching[start:start + rule.evaluation_periods]) >= rule.datapoints_to_alarm
               for start in range(periods))


def test_the_lock_out_alarm_pages_a_lock_out_not_a_healing_episode() -> None:
    """A self-healing episode (refusals on a nearly idle engine four a second for the 15 s the
    valve is tested to heal within, placed across a minute boundary, twice an hour) never pages;
    one refusal a minute for three minutes does (docs/design-decisions.md#admission-lock-out)."""
    from tests.containers.llm.test_admission_healing import HEAL_LIMIT_S

    rule = next(rule for rule in all_rules() if rule.name == "admission-lock-out")
    assert rule.metric is mc.REFUSALS_WHILE_IDLE and rule.severity == "page"
    for start in (0.0, 52.0, 59.9, 1800.0 + 45.0):
        episode = [start + index / 4 for index in range(int(HEAL_LIMIT_S * 4))]
        assert not alarm_fires(rule, episode, span_s=3600), start
    two_episodes = [52.0 + i / 4 for i in range(60)] + [300.0 + i / 4 for i in range(60)]
    assert not alarm_fires(rule, two_episodes, span_s=3600)  # healed twice, minutes apart
    lock_out = [30.0 + 60.0 * minute for minute in range(LOCK_OUT_MINUTES)]
    assert alarm_fires(rule, lock_out, span_s=3600)
