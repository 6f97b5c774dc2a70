"""Sticky sessions: what pinning a conversation to one instance buys, and what it costs.

A conversation's turn reuses its earlier turns' KV only on the instance that computed them and
only while that instance still holds them (:mod:`capacity_model.prefix_reuse`). Two things
decide that, and this module puts numbers on both:

* **Which instance.** Without affinity SageMaker routes every request to the instance with the
  fewest outstanding requests: the previous turn is on the same instance 1/N of the time. With
  SageMaker's stateful sessions (``SessionId``) the gateway pins a conversation to the instance
  that opened its session until the session expires (``GATEWAY_SESSION_TTL_S``); a turn after
  the expiry opens a new session, routed like any request, and starts cold.
* **Whether it is still there.** vLLM keeps a finished request's blocks in its free queue and
  hands the oldest out first (LRU): a conversation's blocks survive as long as the instance
  allocates fewer new blocks than the free queue holds, ``hold = free blocks ÷ blocks allocated
  per second``. The customer's next message arrives a think time later (exponential with mean
  ``think_time_s``), so the share of turns that find their prefix is ``1 − exp(−hold ÷
  think)``.

Pinning has a price in load spread. Least-outstanding routing balances every request; pinned,
an instance carries the sum of its own sessions, each with a request in flight a share ``p`` of
the time, so its in-flight count spreads like a binomial over ``n`` sessions: the p99 is
``1 + z·√((1 − p)/(n·p))`` times the mean (z = 2.326), against ``1 + z·√((1 − p)/(N·n·p))``
when N instances pool their sessions. And it slows the fleet's reaction: a new instance gets
only sessions opened (or re-opened) after it starts, a removed one loses its sessions' cache
(their next turn is a full prefill on another instance). The TTL therefore is chosen as the
fleet's reaction time (detection + provisioning, whole minutes): by the time a scale-out's new
instances serve, every session pinned before the rise has expired once and re-opened on the
least-loaded instance. Longer keeps more prefixes (fewer re-opens) but leaves the rise on the
old instances for longer; the re-open costs ``turn interval ÷ TTL`` of the turns their reuse.

Pure module: standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z99 = 2.326
"""The standard normal's 99th percentile."""
SECONDS_PER_MINUTE = 60


class SessionError(ValueError):
    """Inputs the session model cannot use; the message names the field and value."""


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not (math.isfinite(value) and value > 0):
            raise SessionError(f"{name} {value!r}; accepted: a number > 0")


def recommended_ttl_s(reaction_s: float) -> int:
    """``GATEWAY_SESSION_TTL_S``: the fleet's reaction time (the fastest policy's detection +
    provisioning) in whole minutes, at least one minute."""
    _positive(reaction_s=reaction_s)
    minutes = max(1, math.floor(reaction_s / SECONDS_PER_MINUTE))
    return minutes * SECONDS_PER_MINUTE


def affinity_share(*, sessions: bool, turn_interval_s: float, ttl_s: float,
                   instances: int) -> float:
    """Share of a conversation's turns that reach the instance that served its previous turn.

    With sessions: all but the turns that follow an expiry (one per TTL:
    ``turn_interval ÷ TTL``). Without: 1 in ``instances`` (least-outstanding routing does not
    know the conversation)."""
    _positive(turn_interval_s=turn_interval_s, ttl_s=ttl_s, instances=instances)
    if sessions:
        return max(0.0, 1 - turn_interval_s / ttl_s)
    return 1 / instances


def hold_seconds(*, pool_blocks: float, in_use_blocks: float,
                 allocated_blocks_per_s: float) -> float:
    """How long a finished request's blocks stay in the free queue before LRU hands them out:
    free blocks ÷ blocks allocated per second (0 when nothing is free)."""
    _positive(pool_blocks=pool_blocks, allocated_blocks_per_s=allocated_blocks_per_s)
    return max(0.0, pool_blocks - in_use_blocks) / allocated_blocks_per_s


def retention_share(*, hold_s: float, think_time_s: float) -> float:
    """Share of turns whose previous turn's blocks are still cached when they arrive (think
    time exponential with mean ``think_time_s``)."""
    _positive(think_time_s=think_time_s)
    if hold_s < 0:
        raise SessionError(f"hold_s {hold_s!r}; accepted: >= 0")
    return 1 - math.exp(-hold_s / think_time_s)


@dataclass(frozen=True)
class PinningSpread:
    """Load spread across instances at the target, pinned and not."""

    sessions_per_instance: float
    active_share: float
    p99_over_mean_pinned: float
    p99_over_mean_pooled: float
    overload_share_pinned: float
    """Share of time an instance carries more requests than it sustains, pinned."""
    overload_share_pooled: float


def _normal_tail(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2))


def pinning_spread(*, target_concurrency: float, sustainable_concurrency: float,
                   active_share: float, instances: int) -> PinningSpread:
    """Per-instance in-flight requests when each instance carries its own sessions (pinned) or
    the fleet's requests are pooled by least-outstanding routing, at the fleet's target.

    ``active_share``: the share of time a session has a request in flight (request ÷ (request +
    think time)). Normal approximation of the binomial sum."""
    _positive(target_concurrency=target_concurrency,
              sustainable_concurrency=sustainable_concurrency, instances=instances)
    if not 0 < active_share <= 1:
        raise SessionError(f"active_share {active_share!r}; accepted: (0, 1]")
    sessions = target_concurrency / active_share
    relative_sd = math.sqrt((1 - active_share) / (sessions * active_share))
    pooled_sd = relative_sd / math.sqrt(instances)
    margin = sustainable_concurrency / target_concurrency - 1
    return PinningSpread(
        sessions_per_instance=sessions, active_share=active_share,
        p99_over_mean_pinned=1 + Z99 * relative_sd,
        p99_over_mean_pooled=1 + Z99 * pooled_sd,
        overload_share_pinned=_normal_tail(margin / relative_sd) if relative_sd else 0.0,
        overload_share_pooled=_normal_tail(margin / pooled_sd) if pooled_sd else 0.0,
    )


@dataclass(frozen=True)
class ScaleEffects:
    """What pinning does when the fleet changes size."""

    ttl_s: int
    repin_share: float
    """Share of turns that follow a session expiry (and start cold)."""
    drain_s: int
    """After a scale-out, sessions pinned before it have all re-opened within this long."""
    scale_in_prefill_s: float
    """GPU-seconds the survivors spend re-prefilling the sessions of one removed instance."""


def scale_effects(*, ttl_s: int, turn_interval_s: float, sessions_per_instance: float,
                  cached_history_tokens: float, prefill_tokens_per_s: float) -> ScaleEffects:
    """Scale-out: new instances see only new and re-opened sessions, all of them within one TTL.
    Scale-in: each session of a removed instance re-prefills what its cache held, once."""
    _positive(ttl_s=ttl_s, turn_interval_s=turn_interval_s,
              prefill_tokens_per_s=prefill_tokens_per_s)
    return ScaleEffects(
        ttl_s=ttl_s, repin_share=min(1.0, turn_interval_s / ttl_s), drain_s=ttl_s,
        scale_in_prefill_s=sessions_per_instance * cached_history_tokens / prefill_tokens_per_s)
