"""Fleet routing weighed: least-outstanding requests + stateful sessions against PREFIX_AWARE.

SageMaker routes a request to one instance of the variant. Two of its strategies suit chat
turns that carry their conversation (docs/scaling.md#prefix-aware-routing):

* **``least_outstanding_sessions``** (the platform until issue 39): the first turn goes to the
  instance with the fewest requests in flight and opens a stateful session there; the gateway
  pins the conversation's turns to it until the session expires (``ttl_s``), then the next turn
  opens a new session the same way. A removed instance's sessions are gone: their next turn
  opens a new one elsewhere, cold.
* **``prefix_aware``** (``RoutingStrategy: PREFIX_AWARE``): requests whose first
  ``PrefixLength`` characters match go to the same instance until it holds
  ``ConcurrencyThreshold`` in flight, then to one with more room. With a prefix that covers the
  system prompt *and* the conversation's start, each conversation is its own key; the key is
  placed by rendezvous hashing over the instances in service (AWS does not document its
  placement: a hash that moves only the removed or added instance's share of keys is the
  assumption), so scaling moves a share 1/N of conversations, and a lost instance's
  conversations move without an error. ``prefix_covers_conversation=False`` models a prefix no
  longer than the shared system prompt: every conversation shares a key.

:func:`route` runs a window of conversations (Poisson starts, ``turns`` turns each, exponential
think times, each turn in flight ``request_s``) through a fleet whose size follows
``instances_at`` and reports per strategy: the share of later turns that find their
conversation's prefix cached (same instance as the previous turn × the plan's retention), the
load spread (p99 in flight per instance over the mean, and the share of turns that arrive at an
instance already at the plan's in-flight cap), the first-token p99 (each turn's first token at
its instance's batch and its own uncached tokens, from the plan's latency model), and the turns
that re-prefill their whole history after an instance is removed.

Pure module: standard library only.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

Strategy = Literal["least_outstanding_sessions", "prefix_aware"]
STRATEGIES: tuple[Strategy, ...] = ("least_outstanding_sessions", "prefix_aware")


class RoutingError(ValueError):
    """Inputs the routing model cannot use; the message names the field and value."""


@dataclass(frozen=True)
class Window:
    """A stretch of traffic: its length, its request rate and fleet over time."""

    name: str
    duration_s: float
    requests_per_min: Callable[[float], float]
    instances_at: Callable[[float], int]
    removed_at_s: float | None = None
    """When one instance is taken out (its conversations lose their cache), None: never."""


@dataclass(frozen=True)
class Conversations:
    """What a conversation is: turns, think time, tokens (the plan's long conversation)."""

    turns: int
    think_time_s: float
    request_s: float
    new_tokens_per_turn: float
    """Prefilled on every turn even when the history is cached (message + retrieved context)."""
    history_tokens_per_turn: float
    history_cap_tokens: float
    retention: float
    """Share of a same-instance turn whose prefix is still cached (the plan's LRU retention)."""

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise RoutingError(f"turns: {self.turns!r}; accepted: >= 1")
        if not 0 <= self.retention <= 1:
            raise RoutingError(f"retention: {self.retention!r}; accepted: 0 to 1")
        for name in ("think_time_s", "request_s"):
            if not getattr(self, name) > 0:
                raise RoutingError(f"{name}: {getattr(self, name)!r}; accepted: > 0")


@dataclass(frozen=True)
class Policy:
    """One strategy's settings."""

    strategy: Strategy
    session_ttl_s: float = 360.0
    concurrency_threshold: int = 32
    prefix_covers_conversation: bool = True


@dataclass(frozen=True)
class Outcome:
    """What one strategy did in one window."""

    strategy: str
    turns: int
    prefix_hit_share: float
    in_flight_p99_over_mean: float
    arrivals_at_cap_share: float
    ttft_p99_ms: float
    reprefilled_after_removal: int


@dataclass
class _Instance:
    name: str
    in_flight: int = 0


@dataclass
class _Conversation:
    key: int
    turn: int = 0
    instance: str | None = None
    session_until: float = -1.0
    history: float = 0.0
    lost: bool = False


@dataclass
class _Tally:
    later_turns: int = 0
    hits: int = 0
    at_cap: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    in_flight_samples: list[int] = field(default_factory=list)
    reprefilled: int = 0


def _score(key: int, instance: str) -> int:
    digest = hashlib.blake2b(f"{key}/{instance}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class _Fleet:
    """Instances in service, their in-flight counts, the routing decision."""

    def __init__(self, policy: Policy, cap: int) -> None:
        self.policy, self.cap = policy, cap
        self.instances: dict[str, _Instance] = {}
        self.made = 0
        self.lost = 0

    def resize(self, count: int) -> list[str]:
        """Add or remove instances (the newest go first); the removed names."""
        removed = []
        while len(self.instances) < count:
            name = f"i{self.made}"
            self.made += 1
            self.instances[name] = _Instance(name)
        while len(self.instances) > count:
            name = sorted(self.instances, key=lambda n: int(n[1:]))[-1]
            removed.append(name)
            del self.instances[name]
        return removed

    def least_loaded(self) -> str:
        return min(self.instances.values(), key=lambda i: (i.in_flight, i.name)).name

    def pick(self, conversation: _Conversation, now: float) -> str:
        """Where this turn goes."""
        policy = self.policy
        if policy.strategy == "least_outstanding_sessions":
            alive = conversation.instance in self.instances
            if alive and now <= conversation.session_until:
                return str(conversation.instance)
            conversation.session_until = now + policy.session_ttl_s
            return self.least_loaded()
        key = conversation.key if policy.prefix_covers_conversation else 0
        home = max(self.instances, key=lambda name: _score(key, name))
        if self.instances[home].in_flight >= policy.concurrency_threshold:
            return self.least_loaded()
        return home


def route(window: Window, conversations: Conversations, policy: Policy, *, cap: int,
          ttft_ms: Callable[[int, float], float], seed: int = 39) -> Outcome:
    """Run ``window`` under ``policy`` (module docstring); ``cap`` is the plan's in-flight cap,
    ``ttft_ms(batch, uncached_tokens)`` the plan's first-token p50 at that batch."""
    if cap < 1:
        raise RoutingError(f"cap: {cap!r}; accepted: >= 1")
    rng = random.Random(seed)
    fleet = _Fleet(policy, cap)
    fleet.resize(window.instances_at(0.0))
    tally = _Tally()
    warmup = conversations.turns * (conversations.think_time_s + conversations.request_s)
    events: list[tuple[float, int, str, _Conversation | str]] = []
    sequence = 0

    def push(at: float, kind: str, payload: _Conversation | str) -> None:
        nonlocal sequence
        sequence += 1
        heapq.heappush(events, (at, sequence, kind, payload))

    _schedule_starts(window, conversations, rng, push, -warmup)
    if window.removed_at_s is not None:
        push(window.removed_at_s, "remove", "")
    for second in range(0, math.ceil(window.duration_s), 10):
        push(float(second), "resize", "")
    push(-warmup, "resize", "")
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "end":
            if payload in fleet.instances:
                fleet.instances[str(payload)].in_flight -= 1
            continue
        if kind in ("resize", "remove"):
            _resize(fleet, window, now, removal=kind == "remove")
            if now >= 0:
                tally.in_flight_samples += [i.in_flight for i in fleet.instances.values()]
            continue
        assert isinstance(payload, _Conversation)
        if now >= window.duration_s:
            continue
        _turn(payload, now, fleet, conversations, tally if now >= 0 else _Tally(), ttft_ms, rng)
        push(now + conversations.request_s, "end", str(payload.instance))
        if payload.turn < conversations.turns:
            push(now + conversations.request_s + rng.expovariate(1 / conversations.think_time_s),
                 "turn", payload)
    return _outcome(policy, tally)


def _schedule_starts(window: Window, conversations: Conversations, rng: random.Random,
                     push: Callable[[float, str, _Conversation | str], None],
                     start_s: float) -> None:
    """Conversation starts at the rate that gives the window's requests per minute (each
    conversation brings ``turns`` requests), thinned from the window's peak rate; from
    ``start_s`` (< 0: a warm-up at the window's opening rate, so that the window opens with
    conversations already under way; nothing before 0 is tallied)."""
    peak = max(window.requests_per_min(t) for t in range(0, math.ceil(window.duration_s) + 1,
                                                       10)) / 60 / conversations.turns
    now, key = start_s, 0
    while True:
        now += rng.expovariate(peak)
        if now >= window.duration_s:
            return
        rate = window.requests_per_min(max(0.0, now)) / 60 / conversations.turns
        if rng.random() * peak <= rate:
            key += 1
            push(now, "turn", _Conversation(key=key))


def _resize(fleet: _Fleet, window: Window, now: float, *, removal: bool) -> None:
    """The fleet the window asks for now, less the instances lost (not replaced within the
    window: a replacement takes the provisioning delay)."""
    if removal:
        victim = max(fleet.instances.values(), key=lambda i: (i.in_flight, i.name)).name
        del fleet.instances[victim]
        fleet.lost += 1
    else:
        fleet.resize(max(1, window.instances_at(max(0.0, now)) - fleet.lost))


def _turn(conversation: _Conversation, now: float, fleet: _Fleet, conversations: Conversations,
          tally: _Tally, ttft_ms: Callable[[int, float], float], rng: random.Random) -> None:
    previous = conversation.instance
    lost = previous is not None and previous not in fleet.instances
    chosen = fleet.pick(conversation, now)
    conversation.instance = chosen
    conversation.turn += 1
    instance = fleet.instances[chosen]
    if instance.in_flight >= fleet.cap:
        tally.at_cap += 1
    history = conversation.history
    if conversation.turn > 1:
        tally.later_turns += 1
        hit = chosen == previous and rng.random() < conversations.retention
        tally.hits += hit
        if lost:
            tally.reprefilled += 1
        uncached = conversations.new_tokens_per_turn + (0.0 if hit else history)
    else:
        uncached = conversations.new_tokens_per_turn
    instance.in_flight += 1
    tally.ttft_ms.append(ttft_ms(instance.in_flight, uncached))
    conversation.history = min(conversations.history_cap_tokens,
                               history + conversations.history_tokens_per_turn)


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else 0.0


def _outcome(policy: Policy, tally: _Tally) -> Outcome:
    samples = tally.in_flight_samples
    mean = sum(samples) / len(samples) if samples else 0.0
    label = policy.strategy if policy.prefix_covers_conversation else (
        f"{policy.strategy} (prefix = system prompt only)")
    return Outcome(
        strategy=label, turns=len(tally.ttft_ms),
        prefix_hit_share=tally.hits / tally.later_turns if tally.later_turns else 0.0,
        in_flight_p99_over_mean=_quantile(samples, 0.99) / mean if mean else 0.0,
        arrivals_at_cap_share=tally.at_cap / len(tally.ttft_ms) if tally.ttft_ms else 0.0,
        ttft_p99_ms=_quantile(tally.ttft_ms, 0.99),
        reprefilled_after_removal=tally.reprefilled)
