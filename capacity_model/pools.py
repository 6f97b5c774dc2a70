"""Separate pools for long and short requests, priced with the capacity model
(docs/design-decisions.md#separate-pools).

The ops article behind the request buckets recommends separating "long-context and short-query
traffic into different pools" (docs/design-decisions.md#watch-memory-queue-ttft). What that buys
here is not memory safety (the gateway's buckets already cap each size's concurrency) but latency:
an XL conversation turn prefills ~1,740 tokens, and every short request queued behind it waits;
in a pool of its own the short requests batch deep and the XL turns get a GPU sized for them.

:func:`evaluate_pools` sizes each pool of an option with the same capacity model the endpoint
uses (:func:`capacity_model.llm_capacity`): the pool's buckets (shares renormalised), its share
of the traffic (the day's profile × that share), its instance type, the same SLOs, window,
reuse and fleet policy — including two warm instances per pool. Each pool's month is priced from
its fleet plan over the expected day (:func:`expected_day_instances`: every hour the larger of
the window's floor and what the hour's load needs at the target), the same arithmetic for every
option, so the options compare like for like (``make cost`` simulates only the configuration
in force, releases included).

Pure module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from capacity_model.demand import BucketDemand, request_mix
from capacity_model.fleet import DailyProfile, FleetPlan
from capacity_model.plan import LlmCapacity, llm_capacity
from gpu_budget import INSTANCE_CATALOG, MemoryPlan
from gpu_budget.instances import HOURS_PER_MONTH
from request_buckets import BUCKET_NAMES, RequestBucket


@dataclass(frozen=True)
class PoolSpec:
    """One pool: its name, instance type and the buckets it serves."""

    name: str
    instance_type: str
    buckets: tuple[str, ...]


@dataclass(frozen=True)
class PoolResult:
    """A pool sized and priced."""

    spec: PoolSpec
    traffic_share: float
    capacity: LlmCapacity
    usd_per_hour: float
    expected_day_instance_hours: float

    @property
    def monthly_usd(self) -> float:
        """The expected day × 730 / 24."""
        return self.expected_day_instance_hours * self.usd_per_hour * HOURS_PER_MONTH / 24

    @property
    def night_min(self) -> int:
        """The off-peak floor."""
        return self.capacity.fleet.off_peak.min_capacity

    @property
    def day_min(self) -> int:
        """The business-hours floor."""
        return self.capacity.fleet.business_hours.min_capacity


@dataclass(frozen=True)
class PoolOption:
    """One way to split the traffic, every pool sized."""

    name: str
    pools: tuple[PoolResult, ...]

    @property
    def monthly_usd(self) -> float:
        """All pools."""
        return sum(pool.monthly_usd for pool in self.pools)

    @property
    def night_min(self) -> int:
        """Instances at the quietest night hour, all pools."""
        return sum(pool.night_min for pool in self.pools)

    @property
    def xl_ttft_p99_ms(self) -> float:
        """The XL bucket's first token p99 in the pool that serves it."""
        pool = next(p for p in self.pools if RequestBucket.XL.value in p.spec.buckets)
        return pool.capacity.instance.latency_of(RequestBucket.XL).time_to_first_token_p99_ms


def expected_day_instances(fleet: FleetPlan, profile: DailyProfile) -> list[int]:
    """Instances in service each hour of the expected day: the hour's floor (off-peak or
    business-hours minimum) or what its load needs at the target, within the limits."""
    hours = []
    off_peak, business = fleet.off_peak.start.hour, fleet.business_hours.start.hour
    for hour, load in enumerate(profile.hourly_invocations_per_min):
        night = (off_peak <= hour < business if off_peak < business
                 else not business <= hour < off_peak)
        floor = (fleet.off_peak if night else fleet.business_hours).min_capacity
        hours.append(min(max(floor, fleet.instances_for(load)), fleet.max_capacity))
    return hours


def _pool(base: LlmCapacity, replan: Callable[..., MemoryPlan], spec: PoolSpec,
          table: object) -> PoolResult:
    wanted = {RequestBucket(name) for name in spec.buckets}
    chosen = [d for d in base.mix.demands if d.bucket in wanted]
    share = sum(d.share for d in chosen)
    demands = [BucketDemand(d.bucket, d.share / share, d.prompt_tokens, d.max_tokens,
                            d.output_tokens, d.system_tokens, d.history_tokens) for d in chosen]
    profile = DailyProfile(tuple(v * share for v in base.profile.hourly_invocations_per_min),
                           f"{base.profile.source} × {share:.0%} ({'/'.join(spec.buckets)})")
    plan = replan(instance=spec.instance_type)
    capacity = llm_capacity(
        plan=plan, replan=replan, mix=request_mix(demands, base.mix.bounds), window=base.window,
        table=table, slo=base.slo,  # type: ignore[arg-type]
        admission_watermark=base.instance.admission_watermark, policy=base.policy,
        profile=profile, conversation=base.conversation,
        conversations_wanted=base.conversations_wanted, reuse=base.reuse_inputs)
    day = expected_day_instances(capacity.fleet, profile)
    return PoolResult(spec=spec, traffic_share=share, capacity=capacity,
                      usd_per_hour=INSTANCE_CATALOG[spec.instance_type].on_demand_usd_per_hour,
                      expected_day_instance_hours=float(sum(day)))


def evaluate_pools(base: LlmCapacity, replan: Callable[..., MemoryPlan], table: object,
                   options: Sequence[tuple[str, Sequence[PoolSpec]]]) -> tuple[PoolOption, ...]:
    """Size and price every option (each a list of pools covering every bucket once)."""
    results = []
    for name, pools in options:
        covered = sorted(b for pool in pools for b in pool.buckets)
        expected = sorted(d.bucket.value for d in base.mix.demands)
        if covered != expected:
            raise ValueError(f"pool option {name!r} serves {covered}; accepted: every bucket of "
                             f"the mix once ({expected})")
        results.append(PoolOption(name, tuple(_pool(base, replan, spec, table)
                                              for spec in pools)))
    return tuple(results)


def seed_002_options(instance_type: str, faster: str) -> list[tuple[str, list[PoolSpec]]]:
    """One pool as configured; XL apart on the same GPU; XL apart on ``faster``; everything on
    ``faster``."""
    short = tuple(name for name in BUCKET_NAMES if name != RequestBucket.XL.value)
    return [
        ("one pool (as configured)", [PoolSpec("all", instance_type, BUCKET_NAMES)]),
        ("XL pool + S/M/L pool", [PoolSpec("S/M/L", instance_type, short),
                                  PoolSpec("XL", instance_type, ("XL",))]),
        (f"XL pool on {faster} + S/M/L pool", [PoolSpec("S/M/L", instance_type, short),
                                               PoolSpec("XL", faster, ("XL",))]),
        (f"one pool on {faster}", [PoolSpec("all", faster, BUCKET_NAMES)]),
    ]
