"""When would a new request's first token come? A forecast from what the gateway has in flight.

Admission refuses a request at once, and only when its first token would miss the TTFT SLO
(docs/design-decisions.md#ttft-admission). To know that, the gateway replays its own dispatch
forward in time: the requests running on the engine decode one token per engine step each, a
step takes longer the more sequences run, each finished request returns its KV reservation, and
the queue is served first come, first served as reservations fit (the same rule
:class:`gateway.admission.AdmissionController` dispatches by). The new request's first token
comes when it has been dispatched and prefilled.

What the replay needs is learned from the engine's own behaviour, never assumed per GPU:

* :class:`StepModel` — seconds per engine step as ``a + b × running sequences``, an
  exponentially weighted least-squares fit of the inter-token times the gateway observes on every
  stream (with a weak prior that only matters before the first observations; warmup runs a
  concurrent batch so both ``a`` and ``b`` are measured before /ping turns green);
* :class:`PrefillModel` — prompt tokens per second, from first tokens of requests that were the
  only prefill in flight;
* :class:`OutputLengths` — how many tokens answers really take: the 90th percentile of recent
  completions, capped by each request's ``max_tokens``.

The replay ignores what it cannot know (an answer that ends early frees room sooner; the engine's
internal order may differ), so its error is measured: admission compares forecasts with the first
tokens that followed and reports both.

Pure module: standard library only.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

NEVER = math.inf


@dataclass(frozen=True)
class StepPrior:
    """What the models assume before they have observed anything (replaced by observations)."""

    step_s: float = 0.03
    """Seconds per engine step with one sequence running."""
    step_s_per_sequence: float = 0.002
    """Extra seconds per step for each further running sequence."""
    prefill_tokens_per_s: float = 2000.0


DEFAULT_PRIOR = StepPrior()

class StepModel:
    """Seconds per engine step (one token for every running sequence) as ``a + b × running``.

    Exponentially weighted least squares over ``(running, seconds per token)`` observations,
    started from two pseudo-observations on the prior's line (at 1 and 16 running sequences)
    that fade like old observations do. While the observed batch sizes hardly vary, the slope is
    the prior's and only the level is fitted.
    """

    def __init__(self, prior: StepPrior = DEFAULT_PRIOR, *, half_life: float = 2000.0,
                 prior_weight: float = 1.0) -> None:
        self._decay = 0.5 ** (1.0 / half_life)
        self._prior_slope = prior.step_s_per_sequence
        self._sums = [0.0] * 5  # weight, Σx, Σy, Σxx, Σxy
        for x in (1.0, 16.0):
            self._add(x, prior.step_s + prior.step_s_per_sequence * (x - 1.0), prior_weight)
        self.observations = 0
        self._cached: tuple[float, float] | None = None

    def _add(self, x: float, y: float, weight: float) -> None:
        sums = self._sums
        sums[0] += weight
        sums[1] += weight * x
        sums[2] += weight * y
        sums[3] += weight * x * x
        sums[4] += weight * x * y

    def observe(self, running: int, seconds_per_token: float, tokens: int = 1) -> None:
        """One stream delta: ``tokens`` tokens at ``seconds_per_token`` each, ``running`` live."""
        if running < 1 or tokens < 1 or not 0.0 < seconds_per_token < 60.0:
            return
        decay = self._decay ** tokens
        self._sums = [value * decay for value in self._sums]
        self._add(float(running), seconds_per_token, float(tokens))
        self.observations += 1
        self._cached = None

    def line(self) -> tuple[float, float]:
        """(a, b): the fitted intercept at zero running sequences and the slope per sequence."""
        if self._cached is None:
            w, sx, sy, sxx, sxy = self._sums
            mean_x, mean_y = sx / w, sy / w
            variance_x = sxx / w - mean_x * mean_x
            if variance_x < 0.25:  # batch sizes within about half a sequence of each other
                slope = self._prior_slope
            else:
                slope = max(0.0, (sxy / w - mean_x * mean_y) / variance_x)
            self._cached = (mean_y - slope * mean_x, slope)
        return self._cached

    def step_s(self, running: float) -> float:
        """Forecast seconds per step with ``running`` sequences (never below 0.1 ms)."""
        intercept, slope = self.line()
        return max(1e-4, intercept + slope * max(1.0, running))


class PrefillModel:
    """Prompt tokens the engine prefills per second (exponentially weighted)."""

    def __init__(self, prior: StepPrior = DEFAULT_PRIOR, *, weight: float = 0.2) -> None:
        self.tokens_per_s = prior.prefill_tokens_per_s
        self._weight = weight
        self.observations = 0

    def observe(self, prompt_tokens: int, seconds: float) -> None:
        """A prefill of ``prompt_tokens`` uncached tokens that took ``seconds`` alone."""
        if prompt_tokens < 16 or seconds <= 0:
            return  # too small to tell the rate from the step's fixed cost
        rate = prompt_tokens / seconds
        weight = 1.0 if self.observations == 0 else self._weight
        self.tokens_per_s += weight * (rate - self.tokens_per_s)
        self.observations += 1

    def seconds(self, prompt_tokens: float) -> float:
        """Forecast seconds to prefill ``prompt_tokens``."""
        return max(0.0, prompt_tokens) / self.tokens_per_s


class OutputLengths:
    """How long answers are: the 90th percentile of the last ``window`` answers.

    An answer cut at its ``max_tokens`` says only that it would have been at least that long, so
    the quantile is trusted only while fewer than ``1 − quantile`` of the recent answers were cut
    (then the 90th percentile is a natural length); otherwise, and before ``min_answers`` answers,
    a request is expected to use its whole ``max_tokens``.
    """

    def __init__(self, *, window: int = 256, quantile: float = 0.9,
                 min_answers: int = 20) -> None:
        self._recent: deque[tuple[int, bool]] = deque(maxlen=window)
        self._quantile = quantile
        self._min_answers = min_answers
        self._cached: int | None = None
        self._stale = True

    def observe(self, completion_tokens: int, *, capped: bool) -> None:
        """A finished answer's length, and whether ``max_tokens`` cut it."""
        self._recent.append((max(1, completion_tokens), capped))
        self._stale = True

    def typical(self) -> int | None:
        """The quantile of natural lengths, or None when it cannot be trusted (see above)."""
        if self._stale:
            self._stale = False
            self._cached = None
            capped = sum(1 for _, cut in self._recent if cut)
            if (len(self._recent) >= self._min_answers
                    and capped < (1 - self._quantile) * len(self._recent)):
                ordered = sorted(tokens for tokens, _ in self._recent)
                self._cached = ordered[min(len(ordered) - 1,
                                           int(self._quantile * len(ordered)))]
        return self._cached

    def expected(self, max_tokens: int) -> int:
        """Tokens a request with this ``max_tokens`` is expected to generate."""
        typical = self.typical()
        return max_tokens if typical is None else max(1, min(max_tokens, typical))


@dataclass(frozen=True)
class InFlight:
    """A dispatched request, as the replay sees it."""

    tokens: int
    """KV tokens its reservation holds."""
    remaining_output: float
    """Tokens it is still expected to generate."""
    prefill_tokens: int
    """Prompt tokens still to prefill (0 once its first token came)."""
    bucket: Hashable


@dataclass(frozen=True)
class Queued:
    """A request waiting for dispatch (or the new one)."""

    tokens: int
    prompt_tokens: int
    output_tokens: float
    bucket: Hashable


@dataclass(frozen=True)
class DispatchRules:
    """What limits dispatch: reservable KV tokens, sequences, per-bucket concurrency."""

    limit_tokens: int
    max_running: int
    bucket_caps: Mapping[Any, int]


def first_token_in_s(in_flight: Iterable[InFlight], queued: Iterable[Queued], new: Queued, *,
                     rules: DispatchRules, step_s: Callable[[float], float],
                     prefill_s: Callable[[float], float]) -> float:
    """Seconds from now until ``new``'s first token, if it joins the back of the queue.

    Replays first-come-first-served dispatch (a request blocked only by its bucket's cap lets
    the ones behind it pass, as the controller does) while the running requests decode at
    ``step_s(running)`` seconds per token; prefills run one after another on the engine.
    ``NEVER`` when ``new`` cannot fit even an empty pool.
    """
    if new.tokens > rules.limit_tokens:
        return NEVER
    heap: list[tuple[float, int, int, Hashable]] = []
    used = 0
    running_in: dict[Hashable, int] = {}
    prefill_done_at = 0.0
    for order, flight in enumerate(in_flight):
        heapq.heappush(heap, (flight.remaining_output, order, flight.tokens, flight.bucket))
        used += flight.tokens
        running_in[flight.bucket] = running_in.get(flight.bucket, 0) + 1
        prefill_done_at += prefill_s(flight.prefill_tokens)
    waiting = [*queued, new]
    now = decoded = 0.0
    order = len(heap)
    while True:
        index = 0
        while index < len(waiting):
            item = waiting[index]
            if used + item.tokens > rules.limit_tokens or len(heap) >= rules.max_running:
                break  # first come, first served: nobody passes a request that does not fit
            if running_in.get(item.bucket, 0) >= rules.bucket_caps.get(item.bucket, 1 << 30):
                index += 1  # waits for its bucket; those behind it may go
                continue
            del waiting[index]
            prefill_done_at = max(prefill_done_at, now) + prefill_s(item.prompt_tokens)
            if item is new:
                return prefill_done_at + step_s(len(heap) + 1)
            used += item.tokens
            running_in[item.bucket] = running_in.get(item.bucket, 0) + 1
            order += 1
            heapq.heappush(heap, (decoded + max(1.0, item.output_tokens), order, item.tokens,
                                  item.bucket))
        if not heap:
            return NEVER  # cannot happen while new fits an empty pool; never spin
        finish, _, tokens, bucket = heapq.heappop(heap)
        now += (finish - decoded) * step_s(len(heap) + 1)
        decoded = finish
        used -= tokens
        running_in[bucket] -= 1
