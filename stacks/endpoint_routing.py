"""How SageMaker routes a variant's requests to its instances, and AWS's rules for it.

Two strategies are selectable per environment (``llm.routing_strategy``;
docs/scaling.md#prefix-aware-routing weighs them on production's traffic):

* ``least_outstanding`` — ``RoutingStrategy: LEAST_OUTSTANDING_REQUESTS``; with
  ``llm.capacity.sessions`` the gateway pins a conversation with SageMaker stateful sessions;
* ``prefix_aware`` — ``RoutingStrategy: PREFIX_AWARE`` with a ``PrefixAwareRoutingConfig``:
  ``PrefixLength`` (the system prompt and the conversation's start, in characters) and
  ``ConcurrencyThreshold`` (the plan's in-flight cap: past it a request goes to an instance with
  more room).

AWS's documented constraints, each a rule here (the message names the field, the value and what
is accepted): ``ConcurrencyThreshold`` 1 to 1,024 and ``PrefixLength`` 1,024 to 65,536
(AWS::SageMaker::EndpointConfig PrefixAwareRoutingConfig); the prefix configuration only with
``PREFIX_AWARE`` (ProductionVariantRoutingConfig). AWS documents nothing on a request that
carries a stateful ``SessionId`` under ``PREFIX_AWARE`` — the session routes it to its instance,
the prefix would route it elsewhere — so the two are not combined: ``prefix_aware`` requires
``llm.capacity.sessions: false``. Every property of the routing configuration is "Update
requires: Replacement": a change replaces the endpoint configuration, which the endpoint takes
as a blue/green deployment (``llm.deployment``) like any other change of it.

Pure module: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RoutingStrategyName = Literal["least_outstanding", "prefix_aware"]
ROUTING_STRATEGIES: tuple[str, ...] = ("least_outstanding", "prefix_aware")
THRESHOLD_RANGE = (1, 1024)
PREFIX_LENGTH_RANGE = (1024, 65536)
AWS_STRATEGY = {"least_outstanding": "LEAST_OUTSTANDING_REQUESTS", "prefix_aware": "PREFIX_AWARE"}


@dataclass(frozen=True)
class RoutingChoice:
    """The variant's RoutingConfig."""

    strategy: str
    prefix_length: int | None = None
    concurrency_threshold: int | None = None
    """(stacks.model_endpoint builds the CloudFormation property from these fields.)"""


LEAST_OUTSTANDING = RoutingChoice("LEAST_OUTSTANDING_REQUESTS")


def routing_choice(strategy: str, *, sessions: bool, prefix_length: int,
                   concurrency_threshold: int) -> RoutingChoice:
    """The RoutingConfig for ``strategy``; ValueError names what AWS (or the undocumented
    combination with sessions) does not accept."""
    if strategy not in ROUTING_STRATEGIES:
        raise ValueError(f"llm.routing_strategy: {strategy!r}; accepted: "
                         f"{', '.join(ROUTING_STRATEGIES)}")
    if strategy == "least_outstanding":
        return LEAST_OUTSTANDING
    if sessions:
        raise ValueError("llm.routing_strategy: 'prefix_aware' with llm.capacity.sessions: true;"
                         " accepted: prefix_aware with sessions false (AWS documents no routing "
                         "of a stateful session's requests under PREFIX_AWARE), or "
                         "least_outstanding with sessions")
    low, high = THRESHOLD_RANGE
    if not low <= concurrency_threshold <= high:
        raise ValueError(f"ConcurrencyThreshold (the plan's in-flight cap): "
                         f"{concurrency_threshold!r}; accepted: {low} to {high}")
    low, high = PREFIX_LENGTH_RANGE
    if not low <= prefix_length <= high:
        raise ValueError(f"PrefixLength: {prefix_length!r}; accepted: {low:,} to {high:,}")
    return RoutingChoice(AWS_STRATEGY[strategy], prefix_length, concurrency_threshold)
