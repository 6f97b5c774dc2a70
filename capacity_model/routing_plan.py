"""The routing comparison for a plan: production's busiest hour (with an instance lost midway)
and a release surge the fleet scales out for, under each strategy
(:mod:`capacity_model.routing`), with the plan's own cap, retention, request duration and
latency model; and the rule that picks the strategy the stack adopts.

Pure module.
"""

from __future__ import annotations

from dataclasses import dataclass

from capacity_model.plan import LlmCapacity
from capacity_model.routing import Conversations, Outcome, Policy, Window, route

SURGE_MULTIPLIER, SURGE_RISE_S, SURGE_START_S = 3.0, 900.0, 0.0
"""One Piece's release: ×3 within 15 minutes (the release calendar's multiplier)."""
WINDOW_S = 900.0
CHARACTERS_PER_TOKEN = 4
"""PrefixLength counts characters of the messages' text (OpenAI-compatible API) or bytes of
the body (InvokeEndpoint); Llama 3's tokenizer averages about 4 characters a token in English
(fewer in Japanese, so the prefix reaches further into a Japanese conversation)."""


@dataclass(frozen=True)
class Comparison:
    """Both strategies (and the too-short prefix) in each window, and the winner."""

    windows: tuple[tuple[str, tuple[Outcome, ...]], ...]
    prefix_length: int
    concurrency_threshold: int
    winner: str
    reason: str


def prefix_length(capacity: LlmCapacity) -> int:
    """Characters covering the system prompt and the conversation's first message (its start),
    within PREFIX_AWARE's accepted 1,024–65,536."""
    conversation = capacity.conversation
    tokens = conversation.system_tokens + conversation.tokens_per_turn
    return min(65536, max(1024, tokens * CHARACTERS_PER_TOKEN))


def _windows(capacity: LlmCapacity) -> list[Window]:
    fleet, busiest = capacity.fleet, max(capacity.profile.hourly_invocations_per_min)
    reaction = capacity.policy.detection_s + capacity.policy.provisioning_s
    floor = fleet.business_hours.min_capacity

    def surge(t: float) -> float:
        rise = min(1.0, max(0.0, (t - SURGE_START_S) / SURGE_RISE_S))
        return busiest * (1 + (SURGE_MULTIPLIER - 1) * rise)

    def scaled(t: float) -> int:  # what the fleet's reaction gives: the load a reaction ago
        return min(fleet.max_capacity, max(floor, fleet.instances_for(surge(t - reaction))))

    busy = max(floor, fleet.instances_for(busiest))
    return [
        Window(f"busiest hour ({busiest:,.0f}/min, {busy} instances, one lost at "
               f"{WINDOW_S / 120:g} min)",
               WINDOW_S, lambda _t: busiest, lambda _t: busy, removed_at_s=WINDOW_S / 2),
        Window(f"release surge (×{SURGE_MULTIPLIER:g} in 15 min from {busiest:,.0f}/min, "
               "scaled out a reaction time later)", WINDOW_S, surge, scaled),
    ]


def compare(capacity: LlmCapacity, *, seed: int = 39) -> Comparison:
    """Run both strategies through both windows; the winner (see :func:`winner`)."""
    latency = capacity.latency
    if latency is None:
        raise ValueError("capacity.latency: None; accepted: a plan with its latency model")
    conversation, instance = capacity.conversation, capacity.instance
    talk = Conversations(
        turns=conversation.turns, think_time_s=capacity.reuse_inputs.think_time_s,
        request_s=instance.request_seconds,
        new_tokens_per_turn=conversation.tokens_per_turn + conversation.rag_tokens,
        history_tokens_per_turn=2 * conversation.tokens_per_turn,
        history_cap_tokens=capacity.window.history * capacity.memory_plan.max_model_len,
        retention=capacity.reuse.retention)
    threshold = instance.concurrency
    policies = (Policy("least_outstanding_sessions", session_ttl_s=capacity.reuse.session_ttl_s),
                Policy("prefix_aware", concurrency_threshold=threshold),
                Policy("prefix_aware", concurrency_threshold=threshold,
                       prefix_covers_conversation=False))

    def ttft(batch: int, uncached: float) -> float:
        return latency.ttft_of(min(batch, latency.max_batch_size), uncached).p50_ms

    results = tuple((window.name, tuple(route(window, talk, policy, cap=instance.concurrency,
                                              ttft_ms=ttft, seed=seed)
                                        for policy in policies))
                    for window in _windows(capacity))
    name, reason = winner(results)
    return Comparison(windows=results, prefix_length=prefix_length(capacity),
                      concurrency_threshold=threshold, winner=name, reason=reason)


TTFT_TOLERANCE, HIT_TOLERANCE, CAP_TOLERANCE = 0.05, 0.02, 0.02
"""How much worse than the incumbent the challenger may be on a criterion and still count as
no worse: first-token p99 5 %, prefix hits 2 points, arrivals at the cap 2 points."""


def _worse(challenger: Outcome, incumbent: Outcome) -> list[str]:
    """The criteria on which ``challenger`` is worse than ``incumbent`` beyond the tolerances."""
    worse = []
    if challenger.ttft_p99_ms > incumbent.ttft_p99_ms * (1 + TTFT_TOLERANCE):
        worse.append(f"TTFT p99 {challenger.ttft_p99_ms:,.0f} against "
                     f"{incumbent.ttft_p99_ms:,.0f} ms")
    if challenger.prefix_hit_share < incumbent.prefix_hit_share - HIT_TOLERANCE:
        worse.append(f"prefix hits {challenger.prefix_hit_share:.0%} against "
                     f"{incumbent.prefix_hit_share:.0%}")
    if challenger.arrivals_at_cap_share > incumbent.arrivals_at_cap_share + CAP_TOLERANCE:
        worse.append(f"arrivals at the cap {challenger.arrivals_at_cap_share:.1%} against "
                     f"{incumbent.arrivals_at_cap_share:.1%}")
    return worse


def winner(results: tuple[tuple[str, tuple[Outcome, ...]], ...]) -> tuple[str, str]:
    """The challenger (PREFIX_AWARE, its prefix covering the conversation's start) replaces the
    incumbent (least outstanding + sessions) only if it is no worse on any criterion in any
    window (within the tolerances) and better on one: a switch replaces the endpoint
    configuration and rests on a placement AWS does not document, so it must dominate."""
    worse, better = [], []
    for name, outcomes in results:
        incumbent, challenger = outcomes[0], outcomes[1]
        worse += [f"{name}: {item}" for item in _worse(challenger, incumbent)]
        better += [f"{name}: {item}" for item in _worse(incumbent, challenger)]
    if not worse and better:
        return "prefix_aware", "no worse anywhere; better on " + "; ".join(better)
    if worse:
        return "least_outstanding_sessions", ("PREFIX_AWARE is worse on " + "; ".join(worse)
                                              + (" (better on " + "; ".join(better) + ")"
                                                 if better else ""))
    return "least_outstanding_sessions", "no difference beyond the tolerances: the incumbent stays"


def format_comparison(comparison: Comparison) -> list[str]:
    """The comparison as the text docs/scaling.md quotes."""
    lines = [f"Routing (PREFIX_AWARE: PrefixLength {comparison.prefix_length:,} characters, "
             f"ConcurrencyThreshold {comparison.concurrency_threshold} = the plan's in-flight cap)"]
    for name, outcomes in comparison.windows:
        lines.append(f"  {name}")
        for o in outcomes:
            lines.append(
                f"    {o.strategy:<52} prefix hits {o.prefix_hit_share:>4.0%}, in flight p99 "
                f"{o.in_flight_p99_over_mean:.2f}× the mean, {o.arrivals_at_cap_share:>5.1%} "
                f"arrive at the cap, TTFT p99 {o.ttft_p99_ms:,.0f} ms, "
                f"{o.reprefilled_after_removal} turns re-prefilled after the loss")
    lines.append(f"  adopted: {comparison.winner} ({comparison.reason})")
    return lines
