"""The seeds' criteria read as written, for the planned fleet (pure arithmetic on a plan).

Seed 001 states its LLM criteria for its own traffic — requests of 95 to 220 tokens in all
(prompt and answer: "Request A: actual 180 tokens", B 220, C 95) — while this platform sizes a
heavier mix (912 prompt tokens on average, 15 % of the requests at 2,900). Each criterion is
therefore reported twice, side by side: at the seeds' request size and at this platform's mix,
on the same GPU, engine and latency model:

* **max concurrent requests per GPU >= 60**: the instance's concurrency (the smallest of the KV
  pool, ``max_num_seqs`` and the latency SLOs), as :func:`capacity_model.instance
  .instance_capacity` computes it;
* **P99 latency < 2 s at 50 concurrent requests**: the first token's p99 over all requests, and
  the whole answer's (TTFT p99 + answer × TPOT p99), at 50 in flight;
* **30+-turn conversations within the SLA**: its own row (:mod:`capacity_model.conversations`).

And the criteria the fleet decides (Seed 001's user stories 2 and 4): GPU utilisation on average
during business hours (> 75 %), as the seed measures it — NVML's ``utilization.gpu``
(``pynvml.nvmlDeviceGetUtilizationRates``, what nvidia-smi shows): the share of time a kernel
runs, which on a continuously batching engine is the share of time at least one request is in
flight (Poisson arrivals at ``L`` requests in flight on average: ``1 − e^−L``) — and, named
differently, the plan's own *load over sustainable* (the served load over what the instances
running at that hour sustain), the queue wait p99 at 100 requests a second (< 150 ms: the
wait before a request's prefill starts — the step in progress and the other prefills ahead,
:func:`capacity_model.roofline.queue_wait_seconds` — with the fleet scaled to carry 100/s), and
the LLM instances at 2 AM JST (<= 2).

Pure module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from capacity_model.engine_fit import open_loop_batch
from capacity_model.fleet import DailyProfile, FleetPlan
from capacity_model.instance import InstanceCapacity, mixture_quantile
from capacity_model.latency import LatencyModel, RooflineLatency
from capacity_model.roofline import loop_state, queue_wait_seconds

SEED_REQUEST_TOKENS = (180, 220, 95)
"""Seed 001's example requests, tokens in all."""
SEED_PROMPT_TOKENS, SEED_OUTPUT_TOKENS, SEED_MAX_TOKENS = 100, 65, 512
"""Their mean (165) split as a short chat turn: 100 prompt tokens, a 65-token answer; Seed 001's
own profiling code asks for up to 512 new tokens."""
SEED_BATCH = 50
SEED_CONCURRENT_WANTED = 60
SEED_P99_MS = 2000.0
UTILISATION_WANTED = 0.75
QUEUE_RPS, QUEUE_WAIT_P99_MS = 100.0, 150.0
NIGHT_HOUR, NIGHT_INSTANCES = 2, 2


@dataclass(frozen=True)
class SeedReading:
    """The seeds' per-GPU criteria for one request mix."""

    name: str
    prompt_tokens: float
    output_tokens: float
    concurrency: int
    limited_by: str
    ttft_p99_at_50_ms: float
    answer_p99_at_50_ms: float


def seed_reading(name: str, capacity: InstanceCapacity, latency: LatencyModel,
                 uncached: dict[str, float], shares: dict[str, float], *,
                 prompt_tokens: float, output_tokens: float) -> SeedReading:
    """The criteria for one mix: its instance capacity, and its p99s at 50 in flight."""
    batch = min(SEED_BATCH, latency.max_batch_size)
    ttft = mixture_quantile([(shares[b], latency.ttft_of(batch, tokens))
                             for b, tokens in uncached.items()])
    tpot = latency.at(batch).tpot.p99_ms
    return SeedReading(name=name, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                       concurrency=capacity.concurrency, limited_by=capacity.limited_by,
                       ttft_p99_at_50_ms=ttft, answer_p99_at_50_ms=ttft + output_tokens * tpot)


@dataclass(frozen=True)
class FleetCriteria:
    """The seeds' fleet criteria for the planned fleet."""

    business_load_over_sustainable: float
    """The plan's load over sustainable (not the seed's utilisation)."""
    night_instances: int
    night_invocations_per_min: float
    queue_instances: int
    queue_wait_p99_ms: float | None
    """None when the latency model is a measured profile (no queue in it) or 100/s is beyond
    the fleet's maximum."""
    kernel_busy_share: float = math.nan
    """Seed 001's GPU utilisation (nvidia-smi): the share of business hours a kernel runs."""


def _clamped(fleet: FleetPlan, load: float, hour: float) -> int:
    floor = fleet.business_hours if _in_business(fleet, hour) else fleet.off_peak
    return min(floor.max_capacity, max(floor.min_capacity, fleet.instances_for(load)))


def _in_business(fleet: FleetPlan, hour: float) -> bool:
    start = fleet.business_hours.start.hour + fleet.business_hours.start.minute / 60
    end = fleet.off_peak.start.hour + fleet.off_peak.start.minute / 60
    return (start <= hour < end) if start < end else (hour >= start or hour < end)


def fleet_criteria(fleet: FleetPlan, profile: DailyProfile, latency: LatencyModel,
                   request_seconds: float = 0.0) -> FleetCriteria:
    """Utilisation in business hours (hour by hour: served load over what the instances the
    fleet runs then sustain), the fleet at 2 AM, and the queue wait at 100/s."""
    sustainable = fleet.per_instance_invocations_per_min
    shares, kernel = [], []
    for hour, load in enumerate(profile.hourly_invocations_per_min):
        if _in_business(fleet, hour):
            instances = _clamped(fleet, load, hour)
            shares.append(min(1.0, load / (instances * sustainable)))
            kernel.append(1 - math.exp(-load / 60 / instances * request_seconds))
    night_load = profile.at(NIGHT_HOUR)
    per_min = QUEUE_RPS * 60
    instances = max(1, fleet.instances_for(per_min))
    wait: float | None = None
    if isinstance(latency, RooflineLatency) and instances <= fleet.max_capacity:
        batch = open_loop_batch(latency.inputs, per_min / instances / 60, latency.max_batch_size)
        if batch is not None:
            state = loop_state(latency.inputs, batch)
            busy = max(0.0, batch - 1) / batch
            wait = 1000 * (0.99 * busy * state.mean_step_s + queue_wait_seconds(
                state.prefill_share, state.prefill.extra_s, 0.99))
    return FleetCriteria(
        business_load_over_sustainable=sum(shares) / len(shares) if shares else math.nan,
        night_instances=_clamped(fleet, night_load, NIGHT_HOUR),
        night_invocations_per_min=night_load, queue_instances=instances,
        queue_wait_p99_ms=wait,
        kernel_busy_share=sum(kernel) / len(kernel) if kernel else math.nan)

