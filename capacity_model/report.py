"""Human-readable text for an LLM capacity plan (pure string building)."""

from __future__ import annotations

from collections.abc import Sequence

from capacity_model.fleet import FleetPlan
from capacity_model.plan import LlmCapacity
from capacity_model.pools import PoolOption, expected_day_instances
from capacity_model.price import PriceComparison, price_comparison
from capacity_model.rates import SCENARIOS
from gpu_budget import INSTANCE_CATALOG


def format_fleet(fleet: FleetPlan) -> list[str]:
    """The fleet part: headroom, targets, step thresholds, daily ranges, calendar inputs."""
    lines = [
        "Fleet (Application Auto Scaling)",
        f"  sustainable per instance      {fleet.per_instance_invocations_per_min:,.1f} "
        "invocations/min",
        f"  headroom kept                 {fleet.headroom:.1%} (an unplanned surge's growth "
        f"during {fleet.reaction_s} s of detection + provisioning)",
        f"  target tracking               {fleet.target_invocations_per_instance_per_min:,.1f} "
        "invocations/min/instance",
    ]
    if fleet.target_concurrent_requests_per_model is not None:
        lines.append(f"  high-resolution target        "
                     f"{fleet.target_concurrent_requests_per_model:,.1f} concurrent requests "
                     "per model")
    if fleet.step_threshold_invocations_per_instance_per_min is not None:
        threshold = fleet.step_threshold_invocations_per_instance_per_min
        bands = ", ".join(
            f"+{add} from {threshold + low:,.0f}" for low, _high, add in fleet.step_intervals)
        lines.append(f"  step scaling                  alarm at {threshold:,.1f}/min/instance; "
                     f"{bands}")
    for floor in fleet.floors:
        lines.append(
            f"  {floor.name + ' from ' + floor.start.strftime('%H:%M'):<30}min "
            f"{floor.min_capacity}, max {floor.max_capacity} (expected "
            f"{floor.quietest_invocations_per_min:,.0f}-{floor.busiest_invocations_per_min:,.0f}"
            " invocations/min)")
    lines.append(f"  release calendar              base "
                 f"{fleet.release_base_invocations_per_min:,.0f}/min (the busiest hour) × "
                 "multiplier ÷ "
                 f"{fleet.per_instance_invocations_per_min:,.1f} × {1 + fleet.headroom:.3f}")
    return lines


def format_rates(capacity: LlmCapacity) -> list[str]:
    """The GPU's rates: the range and the scenario in use."""
    rates, inputs = capacity.rates, capacity.reuse_inputs
    if rates is None:
        return ["GPU rates: none in the table (the decode profile's points are used as they are)"]
    prefill = " / ".join(f"{rates.prefill_tokens_per_s(s):,.0f}" for s in SCENARIOS)
    efficiency = " / ".join(f"{rates.bandwidth_efficiency.pick(s):g}" for s in SCENARIOS)
    factor = "" if inputs.prefill_factor == 1 else f", prefill × {inputs.prefill_factor:g}"
    return [
        f"GPU rates ({rates.status}; config/decode_speed.json rates, {len(rates.sources)} "
        f"sources): prefill {prefill} tokens/s, decode {rates.memory_bandwidth_gb_s:g} GB/s × "
        f"{efficiency} (pessimistic / central / optimistic); sized at {inputs.scenario}{factor}",
    ]


def format_reuse(capacity: LlmCapacity) -> list[str]:
    """Prefix reuse: the window's share, sessions, retention, and what a prompt costs."""
    state, summary = capacity.reuse, capacity.conversation_reuse.summary
    instance = capacity.instance
    routing = (f"sticky sessions, TTL {state.session_ttl_s} s (GATEWAY_SESSION_TTL_S): "
               f"{state.affinity:.0%} of turns reach the instance of their previous turn"
               if state.sessions else
               f"no sessions: 1 in {state.instances} turns reaches the instance of its previous "
               "turn")
    return [
        "Prefix reuse (the earlier conversation a prompt carries, from the prefix cache)",
        f"  the window's own share         {state.window_reuse:.1%} ({summary.turns}-turn "
        f"replay, {summary.steps} steps; {summary.cached_share:.0%} of all its prompt tokens "
        "cached on one engine)",
        f"  routing                       {routing}",
        f"  retention                     {state.retention:.0%} (a freed block survives "
        f"{state.hold_s:.0f} s at this load; mean think time "
        f"{capacity.reuse_inputs.think_time_s:g} s)",
        f"  counted                       {state.history_reuse:.1%} of the earlier conversation; "
        f"{instance.mean_cached_prompt_tokens:,.0f} of the mix's "
        f"{capacity.mix.mean_prompt_tokens:,.0f} prompt tokens cached on average",
    ]


def _instances(capacity: LlmCapacity) -> str:
    count = capacity.fleet.business_hours.min_capacity
    return f"{count} instance{'' if count == 1 else 's'}"


def format_sessions(capacity: LlmCapacity) -> list[str]:
    """What pinning does to spread and scaling, and the TTL that follows."""
    spread, effects = capacity.session_effects()
    return [
        "Sticky sessions (what pinning conversations costs and buys)",
        f"  session TTL                   {effects.ttl_s} s: the fleet's reaction time "
        f"({capacity.fleet.reaction_s} s) in whole minutes, so sessions pinned before a rise "
        "have re-opened on the least-loaded instance by the time new ones serve",
        f"  re-opens                      {effects.repin_share:.0%} of turns follow an expiry "
        f"(one turn every {capacity.reuse.turn_interval_s:.0f} s)",
        f"  load spread at the target     {spread.sessions_per_instance:,.0f} sessions per "
        f"instance, each busy {spread.active_share:.0%} of the time: p99 in flight "
        f"{spread.p99_over_mean_pinned:.2f}× the mean pinned vs "
        f"{spread.p99_over_mean_pooled:.2f}× pooled over {_instances(capacity)}; above the "
        "sustainable "
        f"{spread.overload_share_pinned:.1%} vs {spread.overload_share_pooled:.1%} of the time",
        f"  scale-out / scale-in          new instances take only new and re-opened sessions "
        f"(all within {effects.drain_s} s); a removed instance's sessions re-prefill "
        f"{effects.scale_in_prefill_s:,.0f} GPU-seconds on the others",
    ]


def format_conversation_load(capacity: LlmCapacity) -> list[str]:
    """The configured conversation as an instance's whole load."""
    load = capacity.conversation_load
    if load is None:
        return ["  as the whole load             not servable within the SLOs on this GPU"]
    latency = load.capacity.bucket_latency[0]
    turns = "turn" if load.in_flight == 1 else "turns"
    return [
        f"  as the whole load             {load.in_flight} {turns} in flight within the SLOs "
        f"(the pool holds {load.in_flight_kv}; limited by {load.capacity.limited_by}): TTFT p99 "
        f"{latency.time_to_first_token_p99_ms:,.0f} ms, {load.mean_cached_tokens:,.0f} of "
        f"{load.mean_prompt_tokens:,.0f} prompt tokens cached, ≈{load.open_conversations:,.0f} "
        "open conversations per GPU",
    ]


def format_capacity(capacity: LlmCapacity, price: PriceComparison | None = None) -> str:
    """The whole plan as a multi-line table (``price``: priced from a snapshot; default: the
    catalog's rate, :func:`plan_price`)."""
    plan, instance, mix = capacity.memory_plan, capacity.instance, capacity.mix
    lines = [
        f"Capacity plan: {plan.model_name} ({plan.quantization}) on {plan.instance_type} "
        f"({plan.gpu_model}), max_model_len {plan.max_model_len:,}",
        f"KV pool {plan.kv_pool_blocks:,} blocks of {plan.block_size} tokens; admission may "
        f"reserve {instance.admission_watermark:.0%} = {instance.admissible_blocks:,} blocks; "
        f"max_num_seqs {plan.max_num_seqs}",
        f"Latency SLOs: time to first token p99 <= "
        f"{capacity.slo.time_to_first_token_p99_ms:,.0f} ms, time per output token p99 <= "
        f"{capacity.slo.time_per_output_token_p99_ms:,.0f} ms",
        f"Decode speed: {instance.decode_profile} ({instance.decode_status})",
        *format_rates(capacity),
        "",
        "Request mix (prompt + max_tokens decides the bucket)",
        f"  {'bucket':<18}{'share':>7}{'prompt':>8}{'max_tokens':>12}{'generated':>11}",
    ]
    for demand in mix.demands:
        lines.append(f"  {mix.bounds.label(demand.bucket):<18}{demand.share:>7.0%}"
                     f"{demand.prompt_tokens:>8,}{demand.max_tokens:>12,}"
                     f"{demand.output_tokens:>11,}")
    lines += [
        "",
        "Gateway admission caps per instance (GATEWAY_BUCKET_CAPS)",
    ]
    for cap in instance.bucket_caps:
        lines.append(f"  {mix.bounds.label(cap.bucket):<18}{cap.cap:>5}   (KV pool holds "
                     f"{cap.kv_limit} of {cap.largest_request_tokens:,} tokens; limited by "
                     f"{cap.limited_by})")
    lines += ["", *format_reuse(capacity)]
    if capacity.reuse.sessions:
        lines += ["", *format_sessions(capacity)]
    lines += [
        "",
        "One instance, this mix",
        f"  concurrent requests           {instance.concurrency} (KV pool {instance.kv_limit}, "
        f"max_num_seqs {instance.max_num_seqs}, latency SLO {instance.slo_limit}: limited by "
        f"{instance.limited_by})",
        f"  at that batch                 TTFT p50 {instance.time_to_first_token_p50_ms:,.0f} "
        f"ms / p99 {instance.time_to_first_token_p99_ms:,.0f} ms / p99.9 "
        f"{instance.time_to_first_token_p999_ms:,.0f} ms, TPOT p50 "
        f"{instance.time_per_output_token_p50_ms:.1f} ms / p99 "
        f"{instance.time_per_output_token_p99_ms:.1f} ms",
        f"  one request lasts             {instance.request_seconds:.2f} s (TTFT + "
        f"{mix.mean_output_tokens:.0f} generated tokens × TPOT)",
        f"  sustainable                   {instance.sustainable_invocations_per_min:,.1f} "
        "invocations/min",
        "  first token by bucket         " + ", ".join(
            f"{b.bucket} {b.time_to_first_token_p50_ms:,.0f} / {b.time_to_first_token_p99_ms:,.0f}"
            " ms" for b in instance.bucket_latency)
        + f" (p50 / p99; SLO {capacity.slo.time_to_first_token_p99_ms:,.0f} ms p99 over all "
        "requests)",
        f"  tails from                    {instance.tail_source}; the SLO's batch by the closed "
        f"form at the mean request: {instance.closed_form_slo_limit}",
        "",
        *format_fleet(capacity.fleet),
        "",
        f"Long conversations per GPU ({capacity.conversation.turns} turns × "
        f"{capacity.conversation.tokens_per_turn} tokens + {capacity.conversation.rag_tokens:,}"
        " retrieved; no seed asks for a number of them: Seed 001 asks that 30+-turn "
        "conversations be served within the latency SLA, below)",
    ]
    for option in capacity.conversation_options:
        lines.append(
            f"  {option.name:<46}{option.concurrent:>4} (reserves "
            f"{option.request.reserved_tokens:,} tokens, {option.request.turns_kept} turns kept, "
            f"limited by {option.limited_by})")
        for cost in option.costs:
            lines.append(f"      {cost}")
    lines += format_conversation_load(capacity)
    lines += format_seeds(capacity)
    lines += format_price(price or plan_price(capacity))
    notes = instance.notes
    if notes:
        lines += ["", "Notes", *(f"  - {note}" for note in notes)]
    return "\n".join(lines)


def plan_price(capacity: LlmCapacity, usd_per_hour: float | None = None,
               rate_basis: str | None = None) -> PriceComparison:
    """The plan's expected day and the seed's two fleets priced at ``usd_per_hour`` (default:
    the catalog's on-demand rate for the plan's instance, its basis named)."""
    instance = INSTANCE_CATALOG[capacity.memory_plan.instance_type]
    if usd_per_hour is None:
        usd_per_hour = instance.on_demand_usd_per_hour
        rate_basis = (f"the catalog's {instance.price_region} rate, us-east-1's "
                      f"{instance.price_basis} price ${instance.reference_usd_per_hour_us_east_1:g}"
                      " × 1.35 (not a looked-up Tokyo price: config/prices.json)")
    return price_comparison(expected_day_instances(capacity.fleet, capacity.profile),
                            usd_per_hour, rate_basis or "given")


def format_price(price: PriceComparison) -> list[str]:
    """The plan's month beside Seed 001's "before" and its final fleet."""
    return [
        "",
        f"Price per month (the expected day, no release; ${price.usd_per_hour:.3f}/h: "
        f"{price.rate_basis})",
        f"  this plan                     ${price.plan_monthly_usd:,.0f} "
        f"({price.plan_instance_hours_per_day} instance-hours a day)",
        f"  Seed 001's before             ${price.seed_before_monthly_usd:,.0f} (4 always on): "
        f"{price.against_before:+.0%}",
        f"  Seed 001's final fleet        ${price.seed_final_monthly_usd:,.0f} (2 for 5 night "
        f"hours, 4 otherwise): {price.against_final:+.0%}",
    ]


def format_ranges(rows: Sequence[tuple[str, LlmCapacity]]) -> list[str]:
    """How the plan and Seed 001's criteria move across the LoRA cost's and the decode
    efficiency's ranges (each row one what-if, the others at their central values)."""
    lines = ["", "Across the ranges (config/decode_speed.json: LoRA step-time factor, decode "
             "compute efficiency)",
             f"  {'what-if':<34}{'in flight':>22}{'per instance':>14}{'night-day':>11}"
             f"{'TTFT p99 all / XL':>19}{'>= 60 in flight':>17}{'per month':>11}"]
    for label, capacity in rows:
        instance, fleet = capacity.instance, capacity.fleet
        xl = instance.latency_of("XL").time_to_first_token_p99_ms
        price = plan_price(capacity)
        lines.append(
            f"  {label:<34}{f'{instance.concurrency} ({instance.limited_by})':>22}"
            f"{f'{instance.sustainable_invocations_per_min:,.1f}/min':>14}"
            f"{f'{fleet.off_peak.min_capacity}-{fleet.business_hours.min_capacity}':>11}"
            f"{f'{instance.time_to_first_token_p99_ms:,.0f} / {xl:,.0f} ms':>19}"
            f"{_met(instance.concurrency >= 60):>17}"
            f"{f'${price.plan_monthly_usd:,.0f}':>11}")
    return lines


def _met(ok: bool) -> str:
    return "met" if ok else "missed"


def format_seeds(capacity: LlmCapacity) -> list[str]:
    """Seed 001's criteria as written: per GPU at the seeds' request size and at this mix, side
    by side; the 30-turn row; the fleet's criteria for the planned fleet."""
    readings = capacity.seed_readings
    if not readings:
        return []
    lines = ["", "Seed 001's criteria, as written (seeds' requests: 95-220 tokens in all, taken as "
             f"{readings[0].prompt_tokens:,.0f} prompt + {readings[0].output_tokens:,.0f} "
             f"generated; this mix: {readings[-1].prompt_tokens:,.0f} + "
             f"{readings[-1].output_tokens:,.0f} on average, "
             f"{capacity.mix.share_of('XL'):.0%} of requests at "
             f"{next(d.prompt_tokens for d in capacity.mix.demands if d.bucket.value == 'XL'):,}"
             " prompt tokens)",
             f"  {'criterion':<44}" + "".join(f"{r.name:>26}" for r in readings)]
    lines.append(f"  {'concurrent requests per GPU >= 60':<44}" + "".join(
        f"{f'{r.concurrency} ({_met(r.concurrency >= 60)})':>26}" for r in readings))
    lines.append(f"  {'  limited by':<44}" + "".join(f"{r.limited_by:>26}" for r in readings))
    lines.append(f"  {'P99 < 2 s at 50 in flight: first token':<44}" + "".join(
        f"{f'{r.ttft_p99_at_50_ms:,.0f} ms ({_met(r.ttft_p99_at_50_ms < 2000)})':>26}"
        for r in readings))
    lines.append(f"  {'  whole answer (TTFT + answer x TPOT p99)':<44}" + "".join(
        f"{f'{r.answer_p99_at_50_ms:,.0f} ms ({_met(r.answer_p99_at_50_ms < 2000)})':>26}"
        for r in readings))
    xl = capacity.instance.latency_of("XL").time_to_first_token_p99_ms
    slo = capacity.slo.time_to_first_token_p99_ms
    lines.append(f"  {'30+-turn conversations within the SLA':<44}{'-':>26}"
                 f"{f'XL turns p99 {xl:,.0f} ms ({_met(xl <= slo)})':>30}")
    tail, bound = capacity.instance.time_to_first_token_p999_ms, capacity.slo.first_response_p999_ms
    lines.append(f"  {f'P99.9 first response < {bound / 1000:g} s (first token)':<44}{'-':>26}"
                 f"{f'TTFT p99.9 {tail:,.0f} ms ({_met(tail < bound)})':>30}")
    criteria = capacity.fleet_criteria
    if criteria is not None:
        wait = ("not modelled (measured profile, or 100/s beyond the fleet's maximum)"
                if criteria.queue_wait_p99_ms is None
                else f"{criteria.queue_wait_p99_ms:,.0f} ms "
                f"({_met(criteria.queue_wait_p99_ms < 150)})")
        lines += [
            "  the planned fleet",
            f"    GPU utilisation (nvidia-smi) in business hours > 75%   "
            f"{criteria.kernel_busy_share:.0%} ({_met(criteria.kernel_busy_share > 0.75)}: the "
            "share of time a kernel runs, i.e. at least one request in flight)",
            f"    (the plan's own measure, not the seed's: load over sustainable "
            f"{criteria.business_load_over_sustainable:.0%} — served load over what the "
            "instances running each hour sustain)",
            f"    queue wait p99 at 100 RPS < 150 ms              {wait} (at "
            f"{criteria.queue_instances} instances; the step in progress and the prefills "
            "ahead)",
            f"    LLM instances at 2 AM JST <= 2                  {criteria.night_instances} "
            f"({_met(criteria.night_instances <= 2)}: "
            f"{criteria.night_invocations_per_min:,.0f} invocations/min expected then)",
        ]
    return lines


def format_pools(options: Sequence[PoolOption]) -> str:
    """The pool options side by side (a Markdown table)."""
    lines = [
        "| option | pools (instance: per instance, night–day floors, avg instances) | night "
        "min | XL TTFT p99 | per month (expected day) |",
        "|---|---|---|---|---|",
    ]
    for option in options:
        pools = "; ".join(
            f"{p.spec.name} on {p.spec.instance_type}: "
            f"{p.capacity.instance.sustainable_invocations_per_min:,.0f}/min, "
            f"{p.night_min}–{p.day_min}, {p.expected_day_instance_hours / 24:.1f}"
            for p in option.pools)
        lines.append(f"| {option.name} | {pools} | {option.night_min} "
                     f"| {option.xl_ttft_p99_ms / 1000:.2f} s | ${option.monthly_usd:,.0f} |")
    return "\n".join(lines)
