"""Replay a synthesized CloudWatch alarm over simulated metrics, minute by minute.

The scaling simulator says what the fleet did; this module says what an alarm *as synthesized*
would have made of it, so an alarm can be tested against a timeline (a night-time surge, a
release day) instead of only having its template properties asserted. It reads an
``AWS::CloudWatch::Alarm`` (a single metric, or ``Metrics`` with metric math), computes each
period's statistic from raw datapoints, evaluates the expression, and applies the threshold,
``EvaluationPeriods``, ``DatapointsToAlarm`` and ``TreatMissingData``.

What is modelled, and how (CloudWatch's documented behaviour, simplified where noted):

* **Datapoints** are given per metric (namespace, name, dimensions) as one list of values per
  minute (an empty list: nothing published that minute). A period's statistic (``Sum``,
  ``Maximum``, ``Minimum``, ``Average``, ``SampleCount``) is taken over the values of its
  minutes; a period with none is missing — SampleCount too, as in CloudWatch.
* **Metric math**: numbers, query ids, ``+ - * /``, comparisons (1 or 0), ``AND``/``OR``,
  ``IF(c, a, b)`` and ``FILL(s, REPEAT | number | series)``. A binary operation on a timestamp
  where an operand is missing is missing; ``IF`` with a missing branch is missing; a division
  by zero is missing. ``FILL(s, REPEAT)`` repeats the last value before a gap (a leading gap
  stays missing). Any other function is refused, naming it.
* **Evaluation** at the end of each period, over the last ``EvaluationPeriods`` values:
  ``notBreaching``/``breaching`` count a missing value as not breaching/breaching, ``missing``
  and ``ignore`` evaluate the values present (all missing: INSUFFICIENT_DATA, or the previous
  state for ``ignore``). CloudWatch also looks further back for real datapoints when some are
  missing; the timelines this is used on have traffic throughout, so that refinement does not
  change their outcome.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Series = list[float | None]
MetricData = Mapping[tuple[str, str, frozenset[tuple[str, str]]], Sequence[Sequence[float]]]
"""(namespace, metric name, dimensions) -> per minute, the values published in that minute."""

STATISTICS = ("Sum", "Maximum", "Minimum", "Average", "SampleCount")
_COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    "GreaterThanOrEqualToThreshold": lambda v, t: v >= t,
    "GreaterThanThreshold": lambda v, t: v > t,
    "LessThanThreshold": lambda v, t: v < t,
    "LessThanOrEqualToThreshold": lambda v, t: v <= t,
}
_TOKEN = re.compile(r"\s*(?:(?P<number>\d+(?:\.\d+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
                    r"|(?P<op>>=|<=|==|!=|[-+*/(),<>]))")


class AlarmReplayError(ValueError):
    """The alarm uses something this replay does not model; the message names it."""


def metric_key(namespace: str, name: str,
               dimensions: Mapping[str, str]) -> tuple[str, str, frozenset[tuple[str, str]]]:
    """The key of one metric in :data:`MetricData`."""
    return (namespace, name, frozenset(dimensions.items()))


def metrics_from_emf(document: Mapping[str, Any]) -> list[tuple[tuple[str, str,
                                                                       frozenset[tuple[str, str]]],
                                                                 float]]:
    """What CloudWatch Logs extracts from one EMF document: (metric key, value) pairs."""
    found = []
    for directive in document["_aws"]["CloudWatchMetrics"]:
        for dimension_set in directive["Dimensions"]:
            dims = {key: str(document[key]) for key in dimension_set}
            for definition in directive["Metrics"]:
                found.append((metric_key(directive["Namespace"], definition["Name"], dims),
                              float(document[definition["Name"]])))
    return found


@dataclass(frozen=True)
class MetricQuery:
    """A metric with its statistic, as an alarm reads it."""

    namespace: str
    name: str
    dimensions: Mapping[str, str]
    statistic: str


@dataclass(frozen=True)
class ReplayAlarm:
    """The parts of a synthesized alarm that decide its state."""

    name: str
    period_s: int
    threshold: float
    comparison: str
    evaluation_periods: int
    datapoints_to_alarm: int
    treat_missing_data: str
    metrics: Mapping[str, MetricQuery]
    expression: str | None
    """None: the alarm watches its only metric (id ``m``) directly."""

    @classmethod
    def from_template(cls, properties: Mapping[str, Any]) -> ReplayAlarm:
        """Read an ``AWS::CloudWatch::Alarm``'s properties (dimension values must be literal)."""
        name = str(properties.get("AlarmName", "?"))
        comparison = str(properties["ComparisonOperator"])
        if comparison not in _COMPARISONS:
            raise AlarmReplayError(f"{name}: ComparisonOperator {comparison!r} is not modelled; "
                                   f"accepted: {', '.join(_COMPARISONS)}")
        evaluation = int(properties.get("EvaluationPeriods", 1))
        metrics: dict[str, MetricQuery] = {}
        expression: str | None = None
        if "Metrics" not in properties:
            statistic = str(properties.get("Statistic") or properties.get("ExtendedStatistic"))
            metrics["m"] = _checked(name, MetricQuery(
                str(properties["Namespace"]), str(properties["MetricName"]),
                _dimensions(name, properties.get("Dimensions", [])), statistic))
            period = int(properties["Period"])
        else:
            expressions: list[str] = []
            periods: set[int] = set()
            for entry in properties["Metrics"]:
                if "Expression" in entry:
                    if entry.get("ReturnData", True):
                        expressions.append(str(entry["Expression"]))
                    continue
                stat = entry["MetricStat"]
                periods.add(int(stat["Period"]))
                metric = stat["Metric"]
                metrics[str(entry["Id"])] = _checked(name, MetricQuery(
                    str(metric["Namespace"]), str(metric["MetricName"]),
                    _dimensions(name, metric.get("Dimensions", [])), str(stat["Stat"])))
            if len(expressions) != 1 or len(periods) != 1:
                raise AlarmReplayError(
                    f"{name}: expected one returned expression over metrics of one period, "
                    f"found {len(expressions)} and {sorted(periods)}")
            expression, period = expressions[0], periods.pop()
        if period % 60:
            raise AlarmReplayError(f"{name}: Period {period}; accepted: a multiple of 60 s")
        return cls(name=name, period_s=period, threshold=float(properties["Threshold"]),
                   comparison=comparison, evaluation_periods=evaluation,
                   datapoints_to_alarm=int(properties.get("DatapointsToAlarm", evaluation)),
                   treat_missing_data=str(properties.get("TreatMissingData", "missing")),
                   metrics=metrics, expression=expression)

    @property
    def period_min(self) -> int:
        """The period in minutes."""
        return self.period_s // 60

    def series(self, data: MetricData, minutes: int) -> Series:
        """The alarm's metric (or expression) per period, over ``minutes`` of data."""
        inputs = {key: _statistic_series(query, data, minutes, self.period_min)
                  for key, query in self.metrics.items()}
        if self.expression is None:
            return inputs["m"]
        return _Evaluator(self.expression, inputs, minutes // self.period_min).evaluate()

    def states(self, data: MetricData, minutes: int) -> list[str]:
        """The state after each period: ``OK``, ``ALARM`` or ``INSUFFICIENT_DATA``."""
        values = self.series(data, minutes)
        breaches = _COMPARISONS[self.comparison]
        states: list[str] = []
        previous = "INSUFFICIENT_DATA"
        for end in range(1, len(values) + 1):
            window = values[max(0, end - self.evaluation_periods):end]
            present = [v for v in window if v is not None]
            if self.treat_missing_data in ("notBreaching", "breaching"):
                missing_breaches = self.treat_missing_data == "breaching"
                count = sum(1 for v in window if (breaches(v, self.threshold) if v is not None
                                                  else missing_breaches))
                complete = len(window) == self.evaluation_periods
                state = ("ALARM" if count >= self.datapoints_to_alarm
                         else "OK" if complete or present else "INSUFFICIENT_DATA")
            elif not present:
                state = previous if self.treat_missing_data == "ignore" else "INSUFFICIENT_DATA"
            else:
                count = sum(1 for v in present if breaches(v, self.threshold))
                state = "ALARM" if count >= min(self.datapoints_to_alarm, len(present)) else "OK"
            states.append(state)
            previous = state
        return states


def find_alarm(template: Mapping[str, Any], alarm_name: str) -> ReplayAlarm:
    """The alarm named ``alarm_name`` in a synthesized template."""
    for resource in template["Resources"].values():
        properties = resource.get("Properties", {})
        if resource.get("Type") == "AWS::CloudWatch::Alarm" and \
                properties.get("AlarmName") == alarm_name:
            return ReplayAlarm.from_template(properties)
    raise AlarmReplayError(f"no alarm named {alarm_name!r} in the template")


def _dimensions(alarm: str, entries: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    dims: dict[str, str] = {}
    for entry in entries:
        value = entry["Value"]
        if not isinstance(value, str):
            raise AlarmReplayError(f"{alarm}: dimension {entry['Name']} is "
                                   f"{json.dumps(value)}; only literal values can be replayed")
        dims[str(entry["Name"])] = value
    return dims


def _checked(alarm: str, query: MetricQuery) -> MetricQuery:
    if query.statistic not in STATISTICS:
        raise AlarmReplayError(f"{alarm}: statistic {query.statistic!r} of {query.name} is not "
                               f"modelled; accepted: {', '.join(STATISTICS)}")
    return query


def _statistic_series(query: MetricQuery, data: MetricData, minutes: int,
                      period_min: int) -> Series:
    raw = data.get(metric_key(query.namespace, query.name, query.dimensions), [])
    out: Series = []
    for start in range(0, minutes - period_min + 1, period_min):
        values = [v for minute in range(start, start + period_min)
                  for v in (raw[minute] if minute < len(raw) else [])]
        if not values:
            out.append(None)
        elif query.statistic == "Sum":
            out.append(sum(values))
        elif query.statistic == "Maximum":
            out.append(max(values))
        elif query.statistic == "Minimum":
            out.append(min(values))
        elif query.statistic == "Average":
            out.append(sum(values) / len(values))
        else:
            out.append(float(len(values)))
    return out


class _Evaluator:
    """Recursive descent over CloudWatch's metric-math syntax (the subset listed above)."""

    def __init__(self, expression: str, inputs: Mapping[str, Series], length: int) -> None:
        self.expression = expression
        self.inputs = inputs
        self.length = length
        self.tokens: list[str] = []
        position = 0
        while position < len(expression):
            match = _TOKEN.match(expression, position)
            if match is None or match.end() == position:
                if expression[position:].strip() == "":
                    break
                raise AlarmReplayError(f"cannot read {expression[position:]!r} in "
                                       f"{expression!r}")
            self.tokens.append(match.group("number") or match.group("name") or match.group("op"))
            position = match.end()
        self.index = 0

    def evaluate(self) -> Series:
        result = self._or()
        if self.index != len(self.tokens):
            raise AlarmReplayError(f"unexpected {self.tokens[self.index]!r} in "
                                   f"{self.expression!r}")
        return self._series(result)

    # --- grammar ---------------------------------------------------------------------------
    def _peek(self) -> str | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def _take(self, expected: str | None = None) -> str:
        token = self._peek()
        if token is None or (expected is not None and token != expected):
            raise AlarmReplayError(f"expected {expected or 'more'} in {self.expression!r}")
        self.index += 1
        return token

    def _or(self) -> Series | float:
        left = self._and()
        while self._peek() == "OR":
            self._take()
            left = self._binary(left, self._and(), lambda a, b: float(bool(a) or bool(b)))
        return left

    def _and(self) -> Series | float:
        left = self._comparison()
        while self._peek() == "AND":
            self._take()
            left = self._binary(left, self._comparison(), lambda a, b: float(bool(a) and bool(b)))
        return left

    def _comparison(self) -> Series | float:
        left = self._sum()
        operators: dict[str, Callable[[float, float], bool]] = {
            ">": lambda a, b: a > b, "<": lambda a, b: a < b, ">=": lambda a, b: a >= b,
            "<=": lambda a, b: a <= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}
        token = self._peek()
        if token in operators:
            self._take()
            compare = operators[token]
            return self._binary(left, self._sum(), lambda a, b: float(compare(a, b)))
        return left

    def _sum(self) -> Series | float:
        left = self._product()
        while self._peek() in ("+", "-"):
            if self._take() == "+":
                left = self._binary(left, self._product(), lambda a, b: a + b)
            else:
                left = self._binary(left, self._product(), lambda a, b: a - b)
        return left

    def _product(self) -> Series | float:
        left = self._unary()
        while self._peek() in ("*", "/"):
            if self._take() == "*":
                left = self._binary(left, self._unary(), lambda a, b: a * b)
            else:
                left = self._binary(left, self._unary(),
                                    lambda a, b: a / b if b != 0 else math.nan)
        return left

    def _unary(self) -> Series | float:
        if self._peek() == "-":
            self._take()
            return self._binary(0.0, self._unary(), lambda a, b: a - b)
        return self._primary()

    def _primary(self) -> Series | float:
        token = self._take()
        if token == "(":
            value = self._or()
            self._take(")")
            return value
        if re.fullmatch(r"\d+(?:\.\d+)?", token):
            return float(token)
        if token in self.inputs:
            return list(self.inputs[token])
        if token == "IF":
            self._take("(")
            condition = self._or()
            self._take(",")
            then = self._or()
            self._take(",")
            otherwise = self._or()
            self._take(")")
            return self._if(condition, then, otherwise)
        if token == "FILL":
            self._take("(")
            source = self._series(self._or())
            self._take(",")
            if self._peek() == "REPEAT":
                self._take()
                self._take(")")
                return self._repeat(source)
            filler = self._series(self._or())
            self._take(")")
            return [s if s is not None else f for s, f in zip(source, filler, strict=True)]
        raise AlarmReplayError(f"{token!r} in {self.expression!r} is not modelled; accepted: "
                               f"numbers, the query ids {sorted(self.inputs)}, IF, FILL")

    # --- series arithmetic -------------------------------------------------------------------
    def _series(self, value: Series | float) -> Series:
        return list(value) if isinstance(value, list) else [float(value)] * self.length

    def _binary(self, left: Series | float, right: Series | float,
                operation: Callable[[float, float], float]) -> Series | float:
        if not isinstance(left, list) and not isinstance(right, list):
            return _finite(operation(left, right))
        out: Series = []
        for a, b in zip(self._series(left), self._series(right), strict=True):
            out.append(None if a is None or b is None else _finite(operation(a, b)))
        return out

    def _if(self, condition: Series | float, then: Series | float,
            otherwise: Series | float) -> Series:
        out: Series = []
        for c, a, b in zip(self._series(condition), self._series(then), self._series(otherwise),
                           strict=True):
            out.append(None if c is None else (a if c else b))
        return out

    @staticmethod
    def _repeat(source: Series) -> Series:
        out: Series = []
        last: float | None = None
        for value in source:
            last = value if value is not None else last
            out.append(last)
        return out


def _finite(value: float) -> Any:
    return None if math.isnan(value) or math.isinf(value) else value
