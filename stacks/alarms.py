"""Alarms built from the metrics contract, so none can watch a metric nobody emits.

An :class:`AlarmRule` says what one alarm watches (a contract metric, or a metric-math
expression over contract metrics), when it fires, how missing data is read, how loud it is and
which runbook answers it. :class:`EndpointAlarms` turns a list of rules into CloudWatch alarms for
one endpoint variant: "page" rules feed one composite alarm per endpoint, which notifies the
alarm topic; "warn" and "ticket" rules notify the topic directly ("ticket": worked as a ticket in
business hours, never urgent).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_sns as sns
from constructs import Construct

from metrics_contract import MetricSpec, metric
from stacks.nag import acknowledge_guard

RUNBOOK_BASE_URL = "https://github.com/manga-assist/gpu-inference-platform/blob/main/docs/runbooks"
"""Where runbook links in alarm descriptions point: this repository's docs/runbooks/."""

Severity = Literal["page", "warn", "ticket"]


def contract_metric(
    spec: MetricSpec,
    dimensions: Mapping[str, str],
    *,
    statistic: str,
    period: cdk.Duration,
    label: str | None = None,
) -> cloudwatch.Metric:
    """A CloudWatch metric for a contract entry, published with exactly its dimensions.

    ValueError for a :class:`MetricSpec` the contract does not hold (made up or altered), so
    neither an alarm nor a widget can watch a metric nobody emits.
    """
    try:
        known = metric(spec.name, spec.namespace)
    except KeyError as error:
        raise ValueError(str(error.args[0])) from None
    if known != spec:
        raise ValueError(
            f"{spec.namespace}/{spec.name} differs from the contract's definition ({known})"
        )
    if set(dimensions) != set(spec.dimensions):
        raise ValueError(
            f"{spec.name} is published with dimensions {list(spec.dimensions)}, "
            f"not {sorted(dimensions)}"
        )
    return cloudwatch.Metric(
        namespace=spec.namespace,
        metric_name=spec.name,
        dimensions_map=dict(dimensions),
        statistic=statistic,
        period=period,
        label=label,
    )


@dataclass(frozen=True)
class MathInput:
    """One metric of a metric-math expression, under its expression id.

    ``dimensions`` fixes dimensions the alarm's own set lacks (the ``Bucket`` of
    ``AdmissionRejections``): one input per value.
    """

    spec: MetricSpec
    statistic: str
    dimensions: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AlarmRule:
    """What one alarm watches, when it fires, and which runbook answers it.

    Exactly one of ``metric`` (a contract metric and its ``statistic``) or ``expression`` with
    ``inputs`` (metric math over contract metrics) is set.
    """

    name: str
    threshold: float
    comparison: cloudwatch.ComparisonOperator
    period_s: int
    evaluation_periods: int
    datapoints_to_alarm: int
    missing_data: cloudwatch.TreatMissingData
    severity: Severity
    meaning: str
    runbook: str
    metric: MetricSpec | None = None
    statistic: str | None = None
    expression: str | None = None
    inputs: Mapping[str, MathInput] = field(default_factory=dict)
    dimensions: Mapping[str, str] = field(default_factory=dict)
    """Dimensions ``metric`` carries beyond the alarm set's own, fixed to one value (the
    ``Mode`` of ``FirstResponseLatency``)."""
    notify_insufficient_data: bool = False
    """Also notify on INSUFFICIENT_DATA: for a rule whose failure is the metric's absence, with
    ``missing`` data handling (no datapoint in the whole evaluation range)."""

    def __post_init__(self) -> None:
        if (self.metric is None) == (self.expression is None):
            raise ValueError(f"alarm rule {self.name}: set either metric or expression")
        if self.metric is not None and not self.statistic:
            raise ValueError(f"alarm rule {self.name}: a metric needs a statistic")
        if self.expression is not None and not self.inputs:
            raise ValueError(f"alarm rule {self.name}: an expression needs inputs")
        if self.dimensions and self.metric is None:
            raise ValueError(f"alarm rule {self.name}: fixed dimensions are for a metric rule "
                             "(an expression's inputs fix their own)")
        if self.notify_insufficient_data and (
                self.severity == "page"
                or self.missing_data != cloudwatch.TreatMissingData.MISSING):
            raise ValueError(f"alarm rule {self.name}: notify_insufficient_data needs "
                             "missing_data MISSING and a warn or ticket severity")

    def description(self) -> str:
        """Alarm description: what it means and the runbook link."""
        return f"{self.meaning} Runbook: {RUNBOOK_BASE_URL}/{self.runbook}"

    @property
    def watched_metrics(self) -> tuple[MetricSpec, ...]:
        """Every contract metric this rule reads."""
        if self.metric is not None:
            return (self.metric,)
        return tuple(item.spec for item in self.inputs.values())

    def cloudwatch_metric(
        self, dimensions_for: Mapping[str, Mapping[str, str]]
    ) -> cloudwatch.IMetric:
        """The metric (or expression) on concrete dimensions. ``dimensions_for`` maps a
        namespace (or ``*`` for any) to dimension values; each metric takes the keys the
        contract publishes it with."""
        period = cdk.Duration.seconds(self.period_s)
        if self.metric is not None:
            assert self.statistic is not None
            return contract_metric(
                self.metric, _dims(self.metric, dimensions_for, self.dimensions),
                statistic=self.statistic, period=period,
            )
        assert self.expression is not None
        return cloudwatch.MathExpression(
            expression=self.expression,
            using_metrics={
                key: contract_metric(item.spec,
                                     _dims(item.spec, dimensions_for, item.dimensions),
                                     statistic=item.statistic, period=period)
                for key, item in self.inputs.items()
            },
            period=period,
            label=self.name,
        )


def _dims(spec: MetricSpec, dimensions_for: Mapping[str, Mapping[str, str]],
          fixed: Mapping[str, str] | None = None) -> dict[str, str]:
    available = {**(dimensions_for.get(spec.namespace) or dimensions_for["*"]), **(fixed or {})}
    missing = [key for key in spec.dimensions if key not in available]
    if missing:
        raise ValueError(f"{spec.name} needs dimension(s) {missing}; given {sorted(available)}")
    return {key: available[key] for key in spec.dimensions}


class AlarmSet(Construct):
    """CloudWatch alarms for a list of rules on one set of dimensions, plus a paging composite.

    Alarm names are stable (``<name_prefix>-<rule>``): the endpoints' blue/green rollback
    configuration refers to alarms by name. "warn" and "ticket" rules notify the topic
    themselves; "page" rules feed the composite ``<name_prefix>-page``, which notifies the topic.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        name_prefix: str,
        dimensions: Mapping[str, str],
        rules: Sequence[AlarmRule],
        alarm_topic: sns.ITopic,
    ) -> None:
        super().__init__(scope, id_)
        names = [rule.name for rule in rules]
        if len(set(names)) != len(names):
            raise ValueError(f"{name_prefix}: duplicate alarm rule names in {names}")
        action = cloudwatch_actions.SnsAction(alarm_topic)
        self.rules = {rule.name: rule for rule in rules}
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        for rule in rules:
            alarm = cloudwatch.Alarm(
                self,
                rule.name,
                alarm_name=f"{name_prefix}-{rule.name}",
                alarm_description=rule.description(),
                metric=rule.cloudwatch_metric({"*": dimensions}),
                threshold=rule.threshold,
                comparison_operator=rule.comparison,
                evaluation_periods=rule.evaluation_periods,
                datapoints_to_alarm=rule.datapoints_to_alarm,
                treat_missing_data=rule.missing_data,
            )
            if rule.severity != "page":
                alarm.add_alarm_action(action)
                alarm.add_ok_action(action)
                if rule.notify_insufficient_data:
                    alarm.add_insufficient_data_action(action)
            else:
                acknowledge_guard(
                    alarm, "CT.CLOUDWATCH.PR.1",
                    f"A paging alarm: it notifies through the composite {name_prefix}-page, one "
                    "page per endpoint however many of its alarms fire ('You can use composite "
                    "alarms to reduce alarm noise by taking actions only at an aggregated level', "
                    "CloudWatch User Guide, 'Composite alarms', https://docs.aws.amazon.com/"
                    "AmazonCloudWatch/latest/monitoring/alarm-combining.html).")
            self.alarms[rule.name] = alarm

        paging = [rule.name for rule in rules if rule.severity == "page"]
        self.page_alarm: cloudwatch.CompositeAlarm | None = None
        if paging:
            self.page_alarm = cloudwatch.CompositeAlarm(
                self,
                "Page",
                composite_alarm_name=f"{name_prefix}-page",
                alarm_description=(
                    f"Page the on-call for {name_prefix}: one of {', '.join(paging)} is in "
                    f"ALARM. Start at {RUNBOOK_BASE_URL}/README.md"
                ),
                alarm_rule=cloudwatch.AlarmRule.any_of(*(self.alarms[n] for n in paging)),
            )
            self.page_alarm.add_alarm_action(action)
            self.page_alarm.add_ok_action(action)

    def by_name(self, names: Sequence[str]) -> list[cloudwatch.Alarm]:
        """The alarms of the named rules (KeyError naming the unknown one)."""
        missing = [name for name in names if name not in self.alarms]
        if missing:
            raise KeyError(f"no alarm rule(s) {missing}; defined: {sorted(self.alarms)}")
        return [self.alarms[name] for name in names]


class EndpointAlarms(AlarmSet):
    """The alarms of one endpoint variant (EndpointName and VariantName dimensions)."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        endpoint_name: str,
        variant_name: str,
        rules: Sequence[AlarmRule],
        alarm_topic: sns.ITopic,
    ) -> None:
        super().__init__(
            scope,
            id_,
            name_prefix=endpoint_name,
            dimensions={"EndpointName": endpoint_name, "VariantName": variant_name},
            rules=rules,
            alarm_topic=alarm_topic,
        )
        self.endpoint_name = endpoint_name
        self.variant_name = variant_name
