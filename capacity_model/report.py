"""Human-readable text for an LLM capacity plan (pure string building)."""

from __future__ import annotations

from capacity_model.fleet import FleetPlan
from capacity_model.plan import LlmCapacity


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


def format_capacity(capacity: LlmCapacity) -> str:
    """The whole plan as a multi-line table."""
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
    lines += [
        "",
        "One instance, this mix",
        f"  concurrent requests           {instance.concurrency} (KV pool {instance.kv_limit}, "
        f"max_num_seqs {instance.max_num_seqs}, latency SLO {instance.slo_limit}: limited by "
        f"{instance.limited_by})",
        f"  at that batch                 TTFT p50 {instance.time_to_first_token_p50_ms:,.0f} "
        f"ms / p99 {instance.time_to_first_token_p99_ms:,.0f} ms, TPOT p50 "
        f"{instance.time_per_output_token_p50_ms:.1f} ms / p99 "
        f"{instance.time_per_output_token_p99_ms:.1f} ms",
        f"  one request lasts             {instance.request_seconds:.2f} s (TTFT + "
        f"{mix.mean_output_tokens:.0f} generated tokens × TPOT)",
        f"  sustainable                   {instance.sustainable_invocations_per_min:,.1f} "
        "invocations/min",
        "",
        *format_fleet(capacity.fleet),
        "",
        f"Long conversations per GPU ({capacity.conversation.turns} turns × "
        f"{capacity.conversation.tokens_per_turn} tokens + {capacity.conversation.rag_tokens:,}"
        f" retrieved; the requirement is >= {capacity.conversations_wanted})",
    ]
    for option in capacity.conversation_options:
        verdict = "meets" if option.meets(capacity.conversations_wanted) else "short"
        lines.append(
            f"  {option.name:<46}{option.concurrent:>4} ({verdict}; reserves "
            f"{option.request.reserved_tokens:,} tokens, {option.request.turns_kept} turns kept, "
            f"limited by {option.limited_by})")
        for cost in option.costs:
            lines.append(f"      {cost}")
    notes = instance.notes
    if notes:
        lines += ["", "Notes", *(f"  - {note}" for note in notes)]
    return "\n".join(lines)
