"""The alarm replay on hand-made alarms and datapoints: statistics, metric math, missing data."""

from __future__ import annotations

from typing import Any

import pytest

from tools.scaling_sim.alarm import (
    AlarmReplayError,
    ReplayAlarm,
    metric_key,
    metrics_from_emf,
)

DIMS = {"EndpointName": "ep", "VariantName": "v"}


def stat(metric_id: str, name: str, statistic: str, period: int = 60) -> dict[str, Any]:
    return {"Id": metric_id, "ReturnData": False, "MetricStat": {
        "Metric": {"Namespace": "NS", "MetricName": name,
                   "Dimensions": [{"Name": k, "Value": v} for k, v in DIMS.items()]},
        "Period": period, "Stat": statistic}}


def math_alarm(expression: str, *inputs: dict[str, Any], threshold: float = 0.5,
               evaluation: int = 1, datapoints: int | None = None,
               missing: str = "notBreaching") -> ReplayAlarm:
    return ReplayAlarm.from_template({
        "AlarmName": "a", "ComparisonOperator": "GreaterThanOrEqualToThreshold",
        "Threshold": threshold, "EvaluationPeriods": evaluation,
        "DatapointsToAlarm": datapoints or evaluation, "TreatMissingData": missing,
        "Metrics": [{"Id": "e", "Expression": expression, "ReturnData": True}, *inputs]})


def data(**series: list[list[float]]) -> dict[Any, list[list[float]]]:
    return {metric_key("NS", name, DIMS): values for name, values in series.items()}


def test_fill_repeat_keeps_a_leading_gap_and_fills_the_others() -> None:
    alarm = math_alarm("FILL(m, REPEAT)", stat("m", "M", "Maximum"))
    assert alarm.series(data(M=[[], [3], [], [], [5], []]), 6) == [None, 3, 3, 3, 5, 5]


def test_nested_fill_puts_a_constant_where_repeat_cannot() -> None:
    alarm = math_alarm("FILL(FILL(m, REPEAT), 20)", stat("m", "M", "Maximum"))
    assert alarm.series(data(M=[[], [6], []]), 3) == [20, 6, 6]


def test_arithmetic_on_a_missing_operand_is_missing_and_if_guards_division() -> None:
    alarm = math_alarm("IF(p > 0, i / p, 0) - m", stat("i", "I", "Sum"), stat("p", "P", "Sum"),
                       stat("m", "M", "Maximum"))
    series = alarm.series(data(I=[[600], [0], [600], []], P=[[100], [0], [100], []],
                               M=[[6], [6], [], [6]]), 4)
    assert series == [0.0, -6.0, None, None]
    assert math_alarm("i / p", stat("i", "I", "Sum"), stat("p", "P", "Sum")).series(
        data(I=[[1]], P=[[0]]), 1) == [None]


def test_statistics_over_a_five_minute_period() -> None:
    values = [[1, 2], [], [3], [], []]
    for statistic, expected in (("Sum", 6), ("Maximum", 3), ("Minimum", 1), ("Average", 2),
                                ("SampleCount", 3)):
        alarm = math_alarm("m", stat("m", "M", statistic, period=300))
        assert alarm.series(data(M=values), 5) == [expected], statistic
    assert math_alarm("m", stat("m", "M", "SampleCount", 300)).series(data(M=[[]] * 5), 5) == [
        None]


@pytest.mark.parametrize(("missing", "states"), [
    ("notBreaching", ["ALARM", "OK", "OK"]),
    ("breaching", ["ALARM", "ALARM", "ALARM"]),
    ("missing", ["ALARM", "INSUFFICIENT_DATA", "INSUFFICIENT_DATA"]),
    ("ignore", ["ALARM", "ALARM", "ALARM"]),
])
def test_missing_data_treatments(missing: str, states: list[str]) -> None:
    alarm = math_alarm("m", stat("m", "M", "Maximum"), missing=missing)
    assert alarm.states(data(M=[[1], [], []]), 3) == states


def test_m_of_n_needs_enough_breaching_periods() -> None:
    alarm = math_alarm("m", stat("m", "M", "Maximum"), evaluation=3, datapoints=2)
    assert alarm.states(data(M=[[1], [0], [1], [0], [0]]), 5) == [
        "OK", "OK", "ALARM", "OK", "OK"]


def test_a_single_metric_alarm() -> None:
    alarm = ReplayAlarm.from_template({
        "AlarmName": "b", "Namespace": "NS", "MetricName": "M", "Statistic": "Sum",
        "Dimensions": [{"Name": k, "Value": v} for k, v in DIMS.items()], "Period": 60,
        "EvaluationPeriods": 2, "Threshold": 10, "ComparisonOperator": "GreaterThanThreshold",
        "TreatMissingData": "notBreaching"})
    assert alarm.states(data(M=[[11], [12], [1]]), 3) == ["OK", "ALARM", "OK"]


@pytest.mark.parametrize(("expression", "message"), [
    ("ANOMALY_DETECTION_BAND(m)", "'ANOMALY_DETECTION_BAND' .* is not modelled"),
    ("m +", "expected more"),
    ("m ) ", "unexpected"),
])
def test_what_it_cannot_replay_is_refused_by_name(expression: str, message: str) -> None:
    with pytest.raises(AlarmReplayError, match=message):
        math_alarm(expression, stat("m", "M", "Maximum")).series(data(M=[[1]]), 1)


def test_a_token_dimension_cannot_be_replayed() -> None:
    entry = stat("m", "M", "Maximum")
    entry["MetricStat"]["Metric"]["Dimensions"] = [{"Name": "FunctionName",
                                                    "Value": {"Ref": "Fn"}}]
    with pytest.raises(AlarmReplayError, match="only literal values can be replayed"):
        math_alarm("m", entry)


def test_emf_documents_read_back_as_cloudwatch_logs_would() -> None:
    document = {"_aws": {"Timestamp": 0, "CloudWatchMetrics": [{
        "Namespace": "NS", "Dimensions": [["EndpointName", "VariantName"]],
        "Metrics": [{"Name": "M", "Unit": "Count"}, {"Name": "N", "Unit": "Count"}]}]},
        "EndpointName": "ep", "VariantName": "v", "M": 6, "N": 2, "other": "x"}
    assert sorted(metrics_from_emf(document)) == [(metric_key("NS", "M", DIMS), 6.0),
                                                  (metric_key("NS", "N", DIMS), 2.0)]
