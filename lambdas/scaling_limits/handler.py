"""Scaling-limits publisher: the capacity range in force of each variant, once a minute.

The ``capacity-pinned-at-max`` alarm must compare the instance count with the maximum *in force*
— 6 at night and 20 by day in production, whatever a release pre-scale or a dated event from the
release-calendar Lambda sets — and Application Auto Scaling publishes no metric of it. This
function, run every minute by EventBridge, asks ``DescribeScalableTargets`` for each configured
SageMaker variant and prints one CloudWatch EMF line per variant with ``MaxCapacityInForce`` and
``MinCapacityInForce`` (dimensions EndpointName, VariantName). DescribeScalableTargets reports
the limits as they are now, so every way they change (schedules, the calendar, an operator's
``register-scalable-target``) is covered without this function knowing any schedule.

A configured variant that is not registered (deregistered while its instance type changes) is
reported in the log and gets no datapoint: the ``capacity-limits-missing`` alarm says so and the
pinned alarm falls back to the registered maximum. An API failure raises (Lambda Errors); the
next minute's run starts over, so failures are not retried.

Handler: ``handler.handler``. The asset is this folder plus ``metrics_contract/`` (and the module
it reads, ``request_buckets/``); the runtime's own boto3 is used.

Environment:
  SCALABLE_TARGETS   comma-separated ``endpoint/<endpoint>/variant/<variant>`` resource ids
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import boto3

import metrics_contract

SERVICE_NAMESPACE = "sagemaker"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
RESOURCE_ID = re.compile(r"^endpoint/(?P<endpoint>[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))/variant/"
                         r"(?P<variant>[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))$")
MAX_TARGETS = 50
"""DescribeScalableTargets takes at most 50 ResourceIds per call."""


class ConfigurationError(ValueError):
    """SCALABLE_TARGETS is missing or holds something that is not a variant's resource id."""


@dataclass(frozen=True)
class CapacityLimits:
    """One variant's MinCapacity and MaxCapacity as Application Auto Scaling reports them."""

    resource_id: str
    min_capacity: int
    max_capacity: int

    @property
    def dimensions(self) -> dict[str, str]:
        """EndpointName and VariantName, parsed from the resource id."""
        match = RESOURCE_ID.match(self.resource_id)
        if match is None:  # pragma: no cover - resource ids are validated on the way in
            raise ValueError(f"{self.resource_id!r} is not a SageMaker variant resource id")
        return {"EndpointName": match["endpoint"], "VariantName": match["variant"]}


def parse_targets(value: str | None) -> tuple[str, ...]:
    """Read SCALABLE_TARGETS; ConfigurationError names every bad entry and what is accepted."""
    entries = [item.strip() for item in (value or "").split(",") if item.strip()]
    if not entries:
        raise ConfigurationError("SCALABLE_TARGETS is empty; accepted: comma-separated "
                                 "'endpoint/<endpoint-name>/variant/<variant-name>'")
    bad = [entry for entry in entries if not RESOURCE_ID.match(entry)]
    if bad:
        raise ConfigurationError(f"SCALABLE_TARGETS has {bad}; accepted: "
                                 "'endpoint/<endpoint-name>/variant/<variant-name>'")
    if len(entries) > MAX_TARGETS:
        raise ConfigurationError(f"SCALABLE_TARGETS lists {len(entries)} variants; accepted: at "
                                 f"most {MAX_TARGETS} (one DescribeScalableTargets call)")
    return tuple(dict.fromkeys(entries))


def limits_from_response(response: Mapping[str, Any],
                         wanted: Sequence[str]) -> tuple[list[CapacityLimits], list[str]]:
    """The limits of the wanted variants in a DescribeScalableTargets response, and the wanted
    resource ids it does not hold (not registered)."""
    found: dict[str, CapacityLimits] = {}
    for target in response.get("ScalableTargets", []):
        resource_id = target.get("ResourceId")
        if (resource_id in wanted and target.get("ServiceNamespace") == SERVICE_NAMESPACE
                and target.get("ScalableDimension") == SCALABLE_DIMENSION):
            found[resource_id] = CapacityLimits(resource_id=resource_id,
                                                min_capacity=int(target["MinCapacity"]),
                                                max_capacity=int(target["MaxCapacity"]))
    return [found[r] for r in wanted if r in found], [r for r in wanted if r not in found]


def metrics_document(limits: CapacityLimits, *, timestamp_ms: int) -> dict[str, Any]:
    """The EMF document of one variant's limits (through the metrics contract)."""
    return metrics_contract.emf_document(
        {metrics_contract.MAX_CAPACITY_IN_FORCE: limits.max_capacity,
         metrics_contract.MIN_CAPACITY_IN_FORCE: limits.min_capacity},
        limits.dimensions,
        timestamp_ms=timestamp_ms,
        properties={"resource_id": limits.resource_id},
    )


def publish(aas: Any, targets: Sequence[str], *, timestamp_ms: int) -> dict[str, Any]:
    """Describe the targets, print one EMF line per registered one; return the summary."""
    response = aas.describe_scalable_targets(ServiceNamespace=SERVICE_NAMESPACE,
                                             ResourceIds=list(targets),
                                             ScalableDimension=SCALABLE_DIMENSION)
    limits, missing = limits_from_response(response, targets)
    for entry in limits:
        _log(metrics_document(entry, timestamp_ms=timestamp_ms))
    summary = {
        "level": "WARNING" if missing else "INFO",
        "message": "capacity limits published",
        "published": {entry.resource_id: {"min": entry.min_capacity, "max": entry.max_capacity}
                      for entry in limits},
        "not_registered": missing,
    }
    _log(summary)
    return summary


def handler(event: Mapping[str, Any] | None, context: Any) -> dict[str, Any]:
    """Lambda entry point (the event is ignored: every run publishes the limits as they are)."""
    targets = parse_targets(os.environ.get("SCALABLE_TARGETS"))
    return publish(boto3.client("application-autoscaling"), targets,
                   timestamp_ms=int(time.time() * 1000))


def _log(record: Mapping[str, Any]) -> None:
    print(json.dumps(record, default=str, ensure_ascii=False), flush=True)
