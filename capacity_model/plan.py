"""The LLM endpoint's whole capacity plan, from the GPU budget to the fleet, in one object.

:func:`llm_capacity` is what the stacks, the simulator's and the cost report's inputs and
``python -m tools.capacity`` all call: the GPU budget's plan, the request mix, the GPU's rates
(:mod:`capacity_model.rates`, at a scenario), prefix reuse and the latency SLOs give one
instance's capacity (:mod:`capacity_model.instance`); that, the daily traffic profile and the
policy's shape give the fleet's numbers (:mod:`capacity_model.fleet`); and the long-conversation
options answer "60 per GPU" (docs/design-decisions.md#conversations-per-gpu,
:mod:`capacity_model.conversations`).

**Prefix reuse** enters as the share of a prompt's earlier conversation the cache serves:

* the window's own share ``h``: the configured conversation replayed through the gateway's
  window (:func:`capacity_model.prefix_reuse.replay`) on one engine that keeps everything;
* × the share of turns that reach the instance holding the previous turn (``affinity``:
  sticky sessions and their TTL, or 1/N without them: :mod:`capacity_model.sessions`);
* × the share whose blocks are still cached after the customer's think time (``retention``:
  LRU eviction at the instance's own allocation rate).

Retention depends on the load the instance carries, which depends on how much it prefills,
which depends on retention: the plan solves that fixed point (bisection on the product).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from capacity_model.conversations import ConversationOption, conversation_options
from capacity_model.decode_speed import DecodeProfile, DecodeSpeedTable, DecodeTableError
from capacity_model.demand import (
    BucketDemand,
    ContextWindow,
    Conversation,
    DemandError,
    RequestMix,
    request_mix,
)
from capacity_model.fleet import (
    DailyProfile,
    FleetPlan,
    FleetPolicy,
    InstanceLoad,
    Surge,
    fleet_plan,
)
from capacity_model.instance import (
    CapacityError,
    InstanceCapacity,
    LatencySlo,
    instance_capacity,
)
from capacity_model.latency import LatencyModel, RequestShape, RooflineLatency, latency_model
from capacity_model.prefix_reuse import (
    Geometry,
    PromptLayout,
    ReuseSummary,
    TurnReuse,
    replay,
    summarize,
    uniform_turns,
)
from capacity_model.queue_sim import RequestClass, SimResult, simulate
from capacity_model.queue_sim import slo_limit as simulated_slo_limit
from capacity_model.rates import GpuRates, Scenario
from capacity_model.seeds import (
    SEED_BATCH,
    SEED_MAX_TOKENS,
    SEED_OUTPUT_TOKENS,
    SEED_PROMPT_TOKENS,
    FleetCriteria,
    SeedReading,
    fleet_criteria,
    seed_reading,
)
from capacity_model.sessions import (
    PinningSpread,
    ScaleEffects,
    affinity_share,
    hold_seconds,
    pinning_spread,
    recommended_ttl_s,
    retention_share,
    scale_effects,
)
from gpu_budget import MemoryPlan
from serving_contract.environment import (
    GATEWAY_ADMISSION_WATERMARK,
    GATEWAY_BUCKET_CAPS,
    GATEWAY_CONTEXT_SPLIT,
    GATEWAY_CONTEXT_STEP_TURNS,
    GATEWAY_SESSION_TTL_S,
    GATEWAY_TTFT_SLO_S,
)

BISECTION_STEPS = 30
SESSIONS_OFF_ROUNDS = 6
TAIL_ROUNDS = 3
"""Rounds of (simulate the SLO's batch, re-solve the reuse at it) before the cap is taken."""
LLAMA3_OPENING, LLAMA3_HEADER, LLAMA3_MARKER = 1, 4, 20
"""Llama 3's chat template: ``<|begin_of_text|>`` opens the prompt, the assistant header
(``<|start_header_id|>assistant<|end_header_id|>`` + a blank line, 4 tokens) ends it and opens
every answer; the truncation marker message is about 20 tokens."""


@dataclass(frozen=True)
class ReuseInputs:
    """How the capacity model counts reuse, and at which end of the rates' ranges."""

    sessions: bool = True
    """Sticky sessions pin conversations (production); False: least-outstanding routing."""
    think_time_s: float = 45.0
    """Mean time from an answer's end to the customer's next message."""
    scenario: Scenario = "central"
    prefill_factor: float = 1.0
    """Multiplies the scenario's prefill rate (a what-if; 1 in every environment)."""
    lora_step_factor: float | None = None
    """What-if: the adapters' step-time factor (None: the rates' at the scenario)."""
    decode_compute_efficiency: float | None = None
    """What-if: the decode step's compute efficiency (None: the rates' at the scenario)."""
    simulate_tail: bool = True
    """Size the SLO's batch by the simulation of the mix's own buckets (False: the closed
    form at the mix's mean request, the model before issue 39)."""


@dataclass(frozen=True)
class ReuseState:
    """The solved prefix reuse: its three factors and what they rest on."""

    window_reuse: float
    """``h``: the window's own share (one engine, nothing evicted)."""
    affinity: float
    retention: float
    hold_s: float
    turn_interval_s: float
    session_ttl_s: int
    sessions: bool
    instances: int

    @property
    def history_reuse(self) -> float:
        """What the instance capacity counts: ``h × affinity × retention``."""
        return self.window_reuse * self.affinity * self.retention


@dataclass(frozen=True)
class ConversationReuse:
    """The configured conversation replayed through the window."""

    turns: tuple[TurnReuse, ...]
    summary: ReuseSummary
    geometry: Geometry
    layout: PromptLayout


@dataclass(frozen=True)
class ConversationLoad:
    """The configured long conversation as the whole load of one instance: its turns in flight
    within the SLOs, and how many open conversations that is."""

    mean_prompt_tokens: float
    mean_cached_tokens: float
    in_flight_kv: int
    """What the gateway's admission lets the KV pool hold (prompt + ``max_tokens`` each)."""
    capacity: InstanceCapacity
    """One instance serving nothing but these turns (the TTFT SLO over all of them)."""
    think_time_s: float

    @property
    def in_flight(self) -> int:
        """Turns in flight within the SLOs and the pool."""
        return self.capacity.concurrency

    @property
    def open_conversations(self) -> float:
        """Conversations one instance keeps going at that load: each has a turn in flight a
        share request ÷ (request + think time) of the time."""
        request = self.capacity.request_seconds
        return self.in_flight * (request + self.think_time_s) / request


@dataclass(frozen=True)
class LlmCapacity:
    """One LLM endpoint's capacity plan and the inputs it was derived from."""

    memory_plan: MemoryPlan
    mix: RequestMix
    window: ContextWindow
    slo: LatencySlo
    instance: InstanceCapacity
    fleet: FleetPlan
    conversation: Conversation
    conversations_wanted: int
    conversation_options: tuple[ConversationOption, ...]
    load: InstanceLoad
    policy: FleetPolicy
    profile: DailyProfile
    reuse: ReuseState
    conversation_reuse: ConversationReuse
    reuse_inputs: ReuseInputs
    rates: GpuRates | None
    conversation_load: ConversationLoad | None = None
    seed_readings: tuple[SeedReading, ...] = ()
    """Seed 001's per-GPU criteria at the seeds' request size and at this mix
    (:mod:`capacity_model.seeds`)."""
    fleet_criteria: FleetCriteria | None = None
    """Seed 001's fleet criteria for the planned fleet."""
    latency: LatencyModel | None = None
    """The latency model the instance was sized with (at the solved reuse)."""

    def fleet_for(self, surge: Surge, *, provisioning_s: int | None = None) -> FleetPlan:
        """The fleet plan that absorbs ``surge`` unaided (its recommended headroom), with new
        instances serving after ``provisioning_s`` (default: the policy's)."""
        policy = replace(self.policy, unplanned_surge=surge,
                         provisioning_s=(self.policy.provisioning_s if provisioning_s is None
                                         else provisioning_s))
        return fleet_plan(self.load, policy, self.profile)

    @property
    def configured_conversations(self) -> ConversationOption:
        """The option "as configured"."""
        return self.conversation_options[0]

    def gateway_environment(self) -> dict[str, str]:
        """What the gateway must be told so that it admits exactly what this plan sized (and,
        with sessions, pins conversations for the TTL the plan counted)."""
        environment = {
            GATEWAY_BUCKET_CAPS: self.instance.gateway_bucket_caps(),
            GATEWAY_ADMISSION_WATERMARK: f"{self.instance.admission_watermark:g}",
            GATEWAY_CONTEXT_SPLIT: self.window.as_env(),
            GATEWAY_CONTEXT_STEP_TURNS: str(self.window.step_turns),
            # Admission serves what it can start within the TTFT SLO (the prefill valve).
            GATEWAY_TTFT_SLO_S: f"{self.slo.time_to_first_token_p99_ms / 1000:g}",
        }
        if self.reuse.sessions:
            environment[GATEWAY_SESSION_TTL_S] = str(self.reuse.session_ttl_s)
        return environment

    def session_effects(self) -> tuple[PinningSpread, ScaleEffects]:
        """What pinning conversations does at this plan's target: the load spread across the
        business-hours fleet, and the scale-out drain and scale-in re-prefill."""
        instance, fleet = self.instance, self.fleet
        request = instance.request_seconds
        active = request / (request + self.reuse_inputs.think_time_s)
        target = fleet.target_concurrent_requests_per_model or instance.concurrency / (
            1 + fleet.headroom)
        spread = pinning_spread(target_concurrency=target,
                                sustainable_concurrency=instance.concurrency,
                                active_share=active,
                                instances=fleet.business_hours.min_capacity)
        history = max((b.cached_tokens for b in instance.bucket_latency), default=0.0)
        prefill = (self.rates.prefill_tokens_per_s(self.reuse_inputs.scenario)
                   * self.reuse_inputs.prefill_factor if self.rates else 1.0)
        effects = scale_effects(ttl_s=self.reuse.session_ttl_s,
                                turn_interval_s=self.reuse.turn_interval_s,
                                sessions_per_instance=spread.sessions_per_instance,
                                cached_history_tokens=history, prefill_tokens_per_s=prefill)
        return spread, effects

    def template_metadata(self) -> dict[str, Any]:
        """The figures the simulator and the cost report read back from the template."""
        return {
            "per_instance_invocations_per_min": self.fleet.per_instance_invocations_per_min,
            "concurrency_per_instance": self.instance.concurrency,
            "request_seconds": self.instance.request_seconds,
            "headroom": self.fleet.headroom,
            "target_invocations_per_instance_per_min":
                self.fleet.target_invocations_per_instance_per_min,
            "decode_status": self.instance.decode_status,
            "source": self.fleet.source,
        }


def conversation_reuse(conversation: Conversation, window: ContextWindow,
                       plan: MemoryPlan) -> ConversationReuse:
    """Replay ``conversation`` (its turns as exchanges of ``tokens_per_turn`` each way, its
    retrieved context on every turn) through the gateway's window on ``plan``'s engine."""
    geometry = Geometry(max_model_len=plan.max_model_len, window=window,
                        block_size=plan.block_size)
    layout = PromptLayout(system_tokens=conversation.system_tokens, opening_tokens=LLAMA3_OPENING,
                          generation_header_tokens=LLAMA3_HEADER, marker_tokens=LLAMA3_MARKER)
    turns = uniform_turns(conversation.turns, user_tokens=conversation.tokens_per_turn,
                          answer_tokens=conversation.tokens_per_turn,
                          rag_tokens=conversation.rag_tokens)
    results = replay(turns, layout, geometry)
    return ConversationReuse(turns=tuple(results), summary=summarize(results),
                             geometry=geometry, layout=layout)


@dataclass(frozen=True)
class _Sizing:
    """What one instance sizing needs besides the reuse."""

    plan: MemoryPlan
    mix: RequestMix
    profile: DecodeProfile
    rates: GpuRates | None
    slo: LatencySlo
    watermark: float
    inputs: ReuseInputs
    slo_cap: int | None = None
    """The SLO's batch from the simulation (None: the closed form's)."""
    tail: SimResult | None = None
    """The simulation at the plan's batch, whose quantiles the capacity reports."""

    def alone(self, mix: RequestMix) -> _Sizing:
        """The same sizing for another mix, without this mix's simulated cap and tail."""
        return replace(self, mix=mix, slo_cap=None, tail=None)


def _latency(sizing: _Sizing, history_reuse: float) -> LatencyModel:
    plan, mix = sizing.plan, sizing.mix
    shape = RequestShape(prompt_tokens=mix.mean_prompt_tokens,
                         cached_prompt_tokens=mix.mean_cached_tokens(plan.block_size,
                                                                     history_reuse),
                         output_tokens=mix.mean_output_tokens)
    inputs = sizing.inputs
    return latency_model(sizing.profile, rates=sizing.rates, scenario=inputs.scenario,
                         plan=plan, shape=shape, prefill_factor=inputs.prefill_factor,
                         lora_step_factor=inputs.lora_step_factor,
                         decode_compute_efficiency=inputs.decode_compute_efficiency)


def _size(sizing: _Sizing, history_reuse: float) -> InstanceCapacity:
    return instance_capacity(sizing.plan, sizing.mix, _latency(sizing, history_reuse),
                             sizing.slo, admission_watermark=sizing.watermark,
                             history_reuse=history_reuse, slo_cap=sizing.slo_cap,
                             tail=sizing.tail)


def tail_inputs(sizing: _Sizing,
                history_reuse: float) -> tuple[RooflineLatency, list[RequestClass]] | None:
    """The roofline and the mix's buckets the simulation runs (None for a measured profile:
    its points are the tail)."""
    latency = _latency(sizing, history_reuse)
    if not isinstance(latency, RooflineLatency):
        return None
    block = sizing.plan.block_size
    return latency, [RequestClass(d.bucket.value, d.share, d.uncached_tokens(block, history_reuse),
                                  d.output_tokens) for d in sizing.mix.demands]


def _simulated(sizing: _Sizing, window_reuse: float, state: ReuseState,
               instance: InstanceCapacity, *, ttl_s: int,
               instances: int) -> tuple[_Sizing, ReuseState, InstanceCapacity]:
    """The SLO's batch from the simulation of the mix's own buckets, the reuse re-solved at
    it (the batch moves the retention), then the tail simulated at the plan's batch."""
    if not sizing.inputs.simulate_tail:
        return sizing, state, instance
    for _ in range(TAIL_ROUNDS):
        found = tail_inputs(sizing, state.history_reuse)
        if found is None:
            return sizing, state, instance
        latency, classes = found
        limit, _run = simulated_slo_limit(
            latency.inputs, classes, ttft_p99_ms=sizing.slo.time_to_first_token_p99_ms,
            tpot_p99_ms=sizing.slo.time_per_output_token_p99_ms,
            max_batch=latency.max_batch_size, start=instance.closed_form_slo_limit)
        if limit == 0:
            raise CapacityError(
                f"{latency.describe()}: even one request misses the latency SLOs in the "
                "simulation of the mix's own buckets (capacity_model/queue_sim.py); relax the "
                "SLOs, shorten the prompts or choose a faster GPU")
        if limit == sizing.slo_cap:
            break
        sizing = replace(sizing, slo_cap=limit)
        state, instance = solve_reuse(sizing, window_reuse, ttl_s=ttl_s, instances=instances)
    for _ in range(TAIL_ROUNDS + 2):
        found = tail_inputs(sizing, state.history_reuse)
        assert found is not None
        tail = simulate(found[0].inputs, found[1], instance.concurrency)
        slo = sizing.slo
        if (instance.limited_by != "latency SLO" or instance.concurrency == 1
                or (tail.ttft.p99_ms <= slo.time_to_first_token_p99_ms
                    and tail.tpot.p99_ms <= slo.time_per_output_token_p99_ms)):
            break
        # The re-solved reuse moved the tail past the SLO: one in flight fewer.
        sizing = replace(sizing, slo_cap=instance.concurrency - 1)
        state, instance = solve_reuse(sizing, window_reuse, ttl_s=ttl_s, instances=instances)
    sizing = replace(sizing, tail=tail)
    return sizing, state, _size(sizing, state.history_reuse)


def _seed_readings(sizing: _Sizing, history_reuse: float) -> tuple[SeedReading, ...]:
    """The seeds' per-GPU criteria at their request size (nothing cached: a one-turn chat)
    and at this platform's mix, on the same GPU and latency model."""
    bounds, block = sizing.mix.bounds, sizing.plan.block_size
    seeds = request_mix([BucketDemand(bounds.classify(SEED_PROMPT_TOKENS + SEED_MAX_TOKENS),
                                      1.0, SEED_PROMPT_TOKENS, SEED_MAX_TOKENS,
                                      SEED_OUTPUT_TOKENS)], bounds)
    readings = []
    for name, mix, reuse in (("seeds' size", seeds, 0.0), ("this mix", sizing.mix,
                                                             history_reuse)):
        mixed = sizing if mix is sizing.mix else sizing.alone(mix)
        latency = _latency(mixed, reuse)
        reading = seed_reading(
            name, _size(mixed, reuse), latency,
            {d.bucket.value: d.uncached_tokens(block, reuse) for d in mix.demands},
            {d.bucket.value: d.share for d in mix.demands},
            prompt_tokens=mix.mean_prompt_tokens, output_tokens=mix.mean_output_tokens)
        found = tail_inputs(mixed, reuse) if mixed.inputs.simulate_tail else None
        if found is not None:  # the tail of this mix's own buckets at 50 in flight
            run = simulate(found[0].inputs, found[1], min(SEED_BATCH, found[0].max_batch_size))
            reading = replace(reading, ttft_p99_at_50_ms=run.ttft.p99_ms,
                              answer_p99_at_50_ms=run.ttft.p99_ms
                              + mix.mean_output_tokens * run.tpot.p99_ms)
        readings.append(reading)
    return tuple(readings)


def _retention(sizing: _Sizing, capacity: InstanceCapacity) -> tuple[float, float]:
    """(hold seconds, retention share) at the instance's sustainable load."""
    plan, mix = sizing.plan, sizing.mix
    block = plan.block_size
    shared = mix.mean_cached_tokens(block, 0.0)
    in_use = capacity.concurrency * (mix.mean_prompt_tokens - shared
                                     + mix.mean_output_tokens / 2) / block
    uncached = mix.mean_prompt_tokens - capacity.mean_cached_prompt_tokens
    allocated = (capacity.sustainable_invocations_per_min / 60
                 * (uncached + mix.mean_output_tokens) / block)
    hold = hold_seconds(pool_blocks=plan.kv_pool_blocks, in_use_blocks=in_use,
                        allocated_blocks_per_s=allocated)
    return hold, retention_share(hold_s=hold, think_time_s=sizing.inputs.think_time_s)


def _state(sizing: _Sizing, window_reuse: float, factor: float, *, ttl_s: int,
           instances: int) -> tuple[ReuseState, InstanceCapacity]:
    """The reuse state and capacity when the cache serves ``factor`` of the window's reuse."""
    capacity = _size(sizing, window_reuse * factor)
    hold, retention = _retention(sizing, capacity)
    interval = sizing.inputs.think_time_s + capacity.request_seconds
    affinity = affinity_share(sessions=sizing.inputs.sessions, turn_interval_s=interval,
                              ttl_s=ttl_s, instances=instances)
    return ReuseState(window_reuse=window_reuse, affinity=affinity, retention=retention,
                      hold_s=round(hold, 1), turn_interval_s=round(interval, 1),
                      session_ttl_s=ttl_s, sessions=sizing.inputs.sessions,
                      instances=instances), capacity


def solve_reuse(sizing: _Sizing, window_reuse: float, *, ttl_s: int,
                instances: int) -> tuple[ReuseState, InstanceCapacity]:
    """The fixed point ``factor = affinity × retention`` (both depend on the load the factor
    allows), by bisection: ``g(f) = F(f) − f`` is >= 0 at 0 and <= 0 at 1. A factor at which
    not even one request meets the SLOs lies below the fixed point (at one request in flight
    nothing is evicted); CapacityError when even full reuse cannot meet them."""
    _state(sizing, window_reuse, 1.0, ttl_s=ttl_s, instances=instances)  # raises if hopeless
    low, high = 0.0, 1.0
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2
        try:
            state, _capacity = _state(sizing, window_reuse, middle, ttl_s=ttl_s,
                                      instances=instances)
        except CapacityError:
            low = middle
            continue
        if state.affinity * state.retention >= middle:
            low = middle
        else:
            high = middle
    return _state(sizing, window_reuse, high if low == 0 else low, ttl_s=ttl_s,
                  instances=instances)


def _conversation_load(sizing: _Sizing, replayed: ConversationReuse, state: ReuseState,
                       conversation: Conversation, kv_in_flight: int) -> ConversationLoad | None:
    """The replayed conversation's mean turn (its answers ``tokens_per_turn`` long) as a
    one-bucket mix, sized like the endpoint; None when the model cannot serve it at all."""
    turns = replayed.turns
    prompt = round(sum(t.prompt_tokens for t in turns) / len(turns))
    history = round(sum(t.history_tokens for t in turns) / len(turns))
    system = replayed.layout.system_tokens + replayed.layout.opening_tokens
    max_tokens = replayed.geometry.output_tokens
    bounds = sizing.mix.bounds
    try:
        mix = request_mix([BucketDemand(bounds.classify(prompt + max_tokens), 1.0, prompt,
                                        max_tokens, conversation.tokens_per_turn, system,
                                        history)], bounds)
        capacity = _size(sizing.alone(mix), state.history_reuse)
    except (DemandError, CapacityError):
        return None
    return ConversationLoad(mean_prompt_tokens=prompt,
                            mean_cached_tokens=capacity.mean_cached_prompt_tokens,
                            in_flight_kv=kv_in_flight, capacity=capacity,
                            think_time_s=sizing.inputs.think_time_s)


def _rates_for(table: DecodeSpeedTable, plan: MemoryPlan) -> GpuRates | None:
    try:
        return table.rates_for(plan.gpu_model, plan.model_name, plan.quantization)
    except DecodeTableError:
        return None


def llm_capacity(
    *,
    plan: MemoryPlan,
    replan: Callable[..., MemoryPlan],
    mix: RequestMix,
    window: ContextWindow,
    table: DecodeSpeedTable,
    slo: LatencySlo,
    admission_watermark: float,
    policy: FleetPolicy,
    profile: DailyProfile,
    conversation: Conversation,
    conversations_wanted: int,
    reuse: ReuseInputs | None = None,
) -> LlmCapacity:
    """Derive the plan (see the module docstring); errors name the input that fails."""
    inputs = reuse or ReuseInputs()
    decode = table.lookup(plan.gpu_model, plan.model_name, plan.quantization,
                          plan.kv_cache_dtype)
    rates = _rates_for(table, plan)
    sizing = _Sizing(plan=plan, mix=mix, profile=decode, rates=rates, slo=slo,
                     watermark=admission_watermark, inputs=inputs)
    replayed = conversation_reuse(conversation, window, plan)
    ttl_s = recommended_ttl_s(policy.detection_s + policy.provisioning_s)
    instances = policy.min_capacity
    for _ in range(SESSIONS_OFF_ROUNDS):
        state, instance = solve_reuse(sizing.alone(mix), replayed.summary.history_reuse,
                                      ttl_s=ttl_s, instances=instances)
        sizing, state, instance = _simulated(sizing.alone(mix), replayed.summary.history_reuse,
                                             state, instance, ttl_s=ttl_s, instances=instances)
        load = InstanceLoad(
            sustainable_invocations_per_min=instance.sustainable_invocations_per_min,
            concurrency=instance.concurrency,
            source=(f"capacity model: {instance.concurrency} requests in flight "
                    f"({instance.limited_by}) × 60 ÷ {instance.request_seconds:.2f} s per "
                    f"request on {plan.instance_type} ({instance.decode_status} decode speed, "
                    f"{inputs.scenario} rates, {state.history_reuse:.0%} of the earlier "
                    "conversation from the prefix cache)"))
        fleet = fleet_plan(load, policy, profile)
        # Without sessions the reuse depends on how many instances share the traffic: the
        # business-hours floor, found by iterating (sessions ignore it: one round).
        if inputs.sessions or fleet.business_hours.min_capacity == instances:
            break
        instances = fleet.business_hours.min_capacity
    options = conversation_options(
        plan=plan, replan=replan, conversation=conversation, window=window, mix=mix,
        table=table, admission_watermark=admission_watermark, wanted=conversations_wanted)
    return LlmCapacity(
        memory_plan=plan, mix=mix, window=window, slo=slo, instance=instance,
        fleet=fleet, load=load, policy=policy, profile=profile,
        conversation=conversation, conversations_wanted=conversations_wanted,
        conversation_options=options,
        reuse=state, conversation_reuse=replayed, reuse_inputs=inputs, rates=rates,
        conversation_load=_conversation_load(sizing, replayed, state, conversation,
                                             options[0].concurrent),
        seed_readings=_seed_readings(sizing, state.history_reuse),
        fleet_criteria=fleet_criteria(fleet, profile, _latency(sizing, state.history_reuse),
                                      instance.request_seconds),
        latency=_latency(sizing, state.history_reuse),
    )
