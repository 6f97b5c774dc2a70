"""The whole plan with prefix reuse: the fixed point between reuse and load, sessions on and off,
the rates' scenarios, and the TTFT SLO over every request."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from capacity_model import LlmCapacity
from capacity_model.instance import mixture_quantile
from capacity_model.sessions import hold_seconds, recommended_ttl_s, retention_share
from stacks.settings import REPO_ROOT, parse_settings


def prod_with(**capacity: Any) -> LlmCapacity:
    data = yaml.safe_load((REPO_ROOT / "config" / "prod.yaml").read_text(encoding="utf-8"))
    for key, value in capacity.items():
        if key == "think_time_s":
            data["llm"]["capacity"]["conversation"]["think_time_s"] = value
        else:
            data["llm"]["capacity"][key] = value
    return parse_settings(data, source="prod (edited)").llm.capacity_plan()


def test_reuse_is_the_windows_share_times_affinity_times_retention(prod: LlmCapacity) -> None:
    """The solved reuse is consistent with the load it allows: the retention recomputed from
    the instance's own in-use and allocated blocks, the affinity from the session TTL."""
    state, instance, mix, plan = prod.reuse, prod.instance, prod.mix, prod.memory_plan
    assert state.window_reuse == prod.conversation_reuse.summary.history_reuse
    assert instance.history_reuse == pytest.approx(state.history_reuse, abs=1e-3)
    block = plan.block_size
    in_use = instance.concurrency * (mix.mean_prompt_tokens - mix.mean_cached_tokens(block, 0)
                                     + mix.mean_output_tokens / 2) / block
    allocated = (instance.sustainable_invocations_per_min / 60
                 * (mix.mean_prompt_tokens - instance.mean_cached_prompt_tokens
                    + mix.mean_output_tokens) / block)
    hold = hold_seconds(pool_blocks=plan.kv_pool_blocks, in_use_blocks=in_use,
                        allocated_blocks_per_s=allocated)
    assert state.hold_s == pytest.approx(hold, abs=0.1)
    assert state.retention == pytest.approx(retention_share(hold_s=hold, think_time_s=45),
                                            abs=1e-3)
    assert state.session_ttl_s == recommended_ttl_s(prod.fleet.reaction_s) == 360
    assert state.affinity == pytest.approx(1 - state.turn_interval_s / 360, abs=1e-3)


def test_sessions_keep_more_of_the_cache_than_least_outstanding_routing(
        prod: LlmCapacity) -> None:
    off = prod_with(sessions=False)
    assert off.reuse.affinity == pytest.approx(1 / off.reuse.instances)
    assert off.reuse.history_reuse < prod.reuse.history_reuse
    assert (off.instance.sustainable_invocations_per_min
            < prod.instance.sustainable_invocations_per_min)
    # Without sessions the reuse depends on the fleet: the business-hours floor it converged to.
    assert off.reuse.instances == off.fleet.business_hours.min_capacity


def test_a_longer_think_time_evicts_more(prod: LlmCapacity) -> None:
    slow = prod_with(think_time_s=180)
    assert slow.reuse.retention < prod.reuse.retention
    assert slow.instance.history_reuse < prod.instance.history_reuse


def test_the_scenarios_order_the_capacity(prod: LlmCapacity) -> None:
    low = prod_with(rates={"scenario": "pessimistic"})
    high = prod_with(rates={"scenario": "optimistic"})
    rates = [p.instance.sustainable_invocations_per_min for p in (low, prod, high)]
    assert rates == sorted(rates) and len(set(rates)) == 3
    slower = prod_with(rates={"scenario": "central", "prefill_factor": 0.6})
    assert (slower.instance.sustainable_invocations_per_min
            < prod.instance.sustainable_invocations_per_min)


def test_the_ttft_slo_holds_over_all_requests_and_xl_is_reported(prod: LlmCapacity) -> None:
    """At the instance's batch the p99 over every request (buckets mixed by share) is within
    2 s (the SLO's own limit is at or above the batch). The XL bucket's own p99 is reported."""
    instance = prod.instance
    assert instance.slo_limit >= instance.concurrency
    from capacity_model.decode_speed import Latency

    mixed = mixture_quantile([
        (prod.mix.share_of(b.bucket), Latency(b.time_to_first_token_p50_ms,
                                              b.time_to_first_token_p99_ms))
        for b in instance.bucket_latency])
    assert mixed <= prod.slo.time_to_first_token_p99_ms + 1
    xl = instance.latency_of("XL")
    assert xl.cached_tokens == pytest.approx(512 + prod.reuse.history_reuse * 1264, abs=0.2)
    assert xl.time_to_first_token_p99_ms > mixed  # the long turns are the slow tail


def test_mixture_quantile_is_a_quantile() -> None:
    from capacity_model.decode_speed import Latency

    one = Latency(100, 200)
    assert mixture_quantile([(1.0, one)]) == pytest.approx(200, rel=1e-6)
    assert mixture_quantile([(0.5, one), (0.5, dataclasses.replace(one))]) == pytest.approx(
        200, rel=1e-6)
    # 2 % of requests far slower: the p99 lies inside the slow bucket's distribution.
    assert 1000 < mixture_quantile([(0.98, one), (0.02, Latency(1000, 2000))]) < 2000


def test_pinning_spreads_the_load_and_the_ttl_bounds_the_drain(prod: LlmCapacity) -> None:
    spread, effects = prod.session_effects()
    request = prod.instance.request_seconds
    assert spread.active_share == pytest.approx(request / (request + 45))
    assert spread.sessions_per_instance == pytest.approx(
        prod.fleet.target_concurrent_requests_per_model / spread.active_share)
    assert spread.p99_over_mean_pinned > spread.p99_over_mean_pooled > 1
    assert effects.drain_s == prod.reuse.session_ttl_s
    assert effects.repin_share == pytest.approx(prod.reuse.turn_interval_s / 360)


def test_the_thirty_turn_conversation_as_an_instances_whole_load(prod: LlmCapacity) -> None:
    load = prod.conversation_load
    assert load is not None
    turns = prod.conversation_reuse.turns
    assert load.mean_prompt_tokens == round(sum(t.prompt_tokens for t in turns) / len(turns))
    assert load.in_flight_kv == prod.configured_conversations.concurrent
    assert load.in_flight <= load.in_flight_kv
    latency = load.capacity.bucket_latency[0]
    assert latency.time_to_first_token_p99_ms <= prod.slo.time_to_first_token_p99_ms
    request = load.capacity.request_seconds
    assert load.open_conversations == pytest.approx(load.in_flight * (request + 45) / request)
