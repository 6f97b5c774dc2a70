"""When would a new request's first token come? A forecast from what the gateway has in flight.

Admission refuses a request at once, and only when its first token would miss the TTFT SLO
(docs/design-decisions.md#ttft-admission). To know that, the gateway replays its own dispatch
forward in time: the requests running on the engine each emit a token per step and hold one
more KV token for it, a step takes longer the more sequences run, a finished request frees what
it holds, and the queue is served first come, first served as prompts fit beside what the
running requests hold (the same rule :class:`gateway.admission.AdmissionController` dispatches
by, counting what the streams grew). The new request's first token comes after its own
dispatch and its time from dispatch to first token.

Both times are what the gateway itself observes of the engine, under whatever load there is,
never a per-GPU assumption (on a shared CPU, separate prefill and decode rates measured at idle
were off by 1.6× under a burst: the engine batches prefills into the decode steps):

* :class:`StepModel` — seconds per output token of one sequence as ``a + b × running
  sequences``: the time between two deltas of a stream per token they carry (prefills batched
  into that step included), against the sequences running then, fitted by exponentially
  weighted least squares (a weak prior keeps the fit defined until warmup's sequential and
  concurrent requests have measured both ``a`` and ``b``);
* :class:`FirstTokenModel` — seconds from dispatch to first token as ``c + d × prompt tokens
  still to prefill``, its own uncached ones and those of every request dispatched before it that
  has not had its first token (the engine prefills them one after another), fitted the same way
  on every request;
* :class:`OutputLengths` — how many tokens answers really take: the 90th percentile of recent
  completions, capped by each request's ``max_tokens``.

What the replay cannot know (an answer that ends early, the engine's internal order) is measured
instead: admission compares forecasts with the first tokens that followed, reports both and
calibrates later forecasts by the error, both ways (:class:`gateway.admission.ForecastStats`).
A forecast can also be wrong in the other direction, too pessimistic, and then only requests it
admits could ever show it: :class:`ProbeGate` lets one through now and then while admission
refuses by forecast (docs/design-decisions.md#forecast-lock-out).

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
    """Seconds per output token with one sequence running."""
    step_s_per_sequence: float = 0.002
    """Extra seconds per output token for each further running sequence."""
    first_token_s: float = 0.05
    """Seconds from dispatch to the first token of a short prompt."""
    prefill_tokens_per_s: float = 2000.0
    """Uncached prompt tokens per second the first token waits for."""


DEFAULT_PRIOR = StepPrior()


class LineModel:
    """``y = a + b × x``, fitted by exponentially weighted least squares.

    Starts from two pseudo-observations on a prior line (at ``x_low`` and ``x_high``) that fade
    as old observations do. While the observed ``x`` hardly vary, the slope stays the prior's
    and only the level is fitted.
    """

    def __init__(self, intercept: float, slope: float, *, x_low: float, x_high: float,
                 half_life: float = 500.0, prior_weight: float = 1.0,
                 min_spread: float = 0.5) -> None:
        self._decay = 0.5 ** (1.0 / half_life)
        self._prior_slope = slope
        self._min_variance = min_spread * min_spread
        self._sums = [0.0] * 5  # weight, Σx, Σy, Σxx, Σxy
        for x in (x_low, x_high):
            self._add(x, intercept + slope * x, prior_weight)
        self.observations = 0
        self._cached: tuple[float, float] | None = None

    def _add(self, x: float, y: float, weight: float) -> None:
        sums = self._sums
        sums[0] += weight
        sums[1] += weight * x
        sums[2] += weight * y
        sums[3] += weight * x * x
        sums[4] += weight * x * y

    def observe(self, x: float, y: float, weight: float = 1.0) -> None:
        """One observation of ``y`` at ``x``, counted ``weight`` times."""
        if weight <= 0 or not (math.isfinite(x) and math.isfinite(y)):
            return
        decay = self._decay ** weight
        self._sums = [value * decay for value in self._sums]
        self._add(x, y, weight)
        self.observations += 1
        self._cached = None

    def line(self) -> tuple[float, float]:
        """(a, b)."""
        if self._cached is None:
            w, sx, sy, sxx, sxy = self._sums
            mean_x, mean_y = sx / w, sy / w
            variance_x = sxx / w - mean_x * mean_x
            if variance_x < self._min_variance:
                slope = self._prior_slope
            else:
                slope = max(0.0, (sxy / w - mean_x * mean_y) / variance_x)
            self._cached = (mean_y - slope * mean_x, slope)
        return self._cached

    def at(self, x: float) -> float:
        """The line's value at ``x`` (never below 0.1 ms)."""
        intercept, slope = self.line()
        return max(1e-4, intercept + slope * x)


class StepModel(LineModel):
    """Seconds per output token of one sequence with ``running`` sequences (see the module
    docstring): ``a + b × running``."""

    def __init__(self, prior: StepPrior = DEFAULT_PRIOR, *, half_life: float = 500.0) -> None:
        super().__init__(prior.step_s - prior.step_s_per_sequence, prior.step_s_per_sequence,
                         x_low=1.0, x_high=16.0, half_life=half_life)

    def step_s(self, running: float) -> float:
        """Forecast seconds per output token with ``running`` sequences."""
        return self.at(max(1.0, running))


class FirstTokenModel(LineModel):
    """Seconds from dispatch to the first token: ``c + d × prompt tokens to prefill first`` (its
    own uncached ones and those ahead of it, see the module docstring)."""

    def __init__(self, prior: StepPrior = DEFAULT_PRIOR, *, half_life: float = 200.0) -> None:
        super().__init__(prior.first_token_s, 1.0 / prior.prefill_tokens_per_s, x_low=0.0,
                         x_high=2048.0, half_life=half_life, min_spread=64.0)

    def seconds(self, prompt_tokens: float) -> float:
        """Forecast seconds from dispatch to the first token with ``prompt_tokens`` to prefill
        (its own and those ahead of it)."""
        return self.at(max(0.0, prompt_tokens))


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
    """KV tokens it holds now (its prompt and its answer so far); it grows by one a step."""
    remaining_output: float
    """Tokens it is still expected to generate."""
    bucket: Hashable
    prefill_tokens: int = 0
    """Prompt tokens still to prefill (0 once its first token came)."""


@dataclass(frozen=True)
class Queued:
    """A request waiting for dispatch (or the new one)."""

    tokens: int
    """KV tokens it takes when dispatched (its prompt); it grows by one a step from then."""
    prompt_tokens: int
    output_tokens: float
    bucket: Hashable


@dataclass(frozen=True)
class DispatchRules:
    """What limits dispatch: KV tokens the running requests may hold, sequences, per-bucket
    concurrency."""

    limit_tokens: int
    max_running: int
    bucket_caps: Mapping[Any, int]


def _prefilled(first_token_s: Callable[[float], float], now: float, prefilled_at: float,
               prompt_tokens: int) -> float:
    """When a request dispatched at ``now`` has its first token: ``first_token_s`` of its own
    prompt after dispatch, or its prompt's share of that time after the prefills ahead of it
    (done at ``prefilled_at``), whichever is later."""
    own = first_token_s(prompt_tokens)
    return max(now + own, prefilled_at + own - first_token_s(0))


def first_token_in_s(in_flight: Iterable[InFlight], queued: Iterable[Queued], new: Queued, *,
                     rules: DispatchRules, step_s: Callable[[float], float],
                     first_token_s: Callable[[float], float]) -> float:
    """Seconds from now until ``new``'s first token, if it joins the back of the queue.

    Replays first-come-first-served dispatch (a request blocked only by its bucket's cap lets
    the ones behind it pass, as the controller does) while the running requests emit a token
    every ``step_s(running)`` seconds (a pace measured with the engine's prefills in it) and
    hold one more KV token for each (so a queued prompt waits for what the running answers will
    hold when one of them ends, as the controller's ledger counts it); a
    dispatched request's first token comes ``first_token_s(tokens)`` after its dispatch for its
    own prompt tokens, or, when prefills dispatched before it are still running, its own
    prompt's share of that time after the last of them: the engine prefills one after another,
    so a request dispatched later never has its first token sooner.
    ``NEVER`` when ``new`` cannot fit even an empty pool.
    """
    if new.tokens > rules.limit_tokens:
        return NEVER
    # (finish, order, tokens at entry, bucket, decoded at entry): a running entry holds
    # tokens at entry + (decoded - decoded at entry) as the replay decodes.
    heap: list[tuple[float, int, int, Hashable, float]] = []
    used = 0.0
    running_in: dict[Hashable, int] = {}
    prefilled_at = 0.0  # when the prefills dispatched so far are done (their last first token)
    now = decoded = 0.0
    for order, flight in enumerate(in_flight):
        heapq.heappush(heap, (flight.remaining_output, order, flight.tokens, flight.bucket, 0.0))
        used += flight.tokens
        running_in[flight.bucket] = running_in.get(flight.bucket, 0) + 1
        if flight.prefill_tokens:
            prefilled_at = _prefilled(first_token_s, now, prefilled_at, flight.prefill_tokens)
    waiting = [*queued, new]
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
            first_at = _prefilled(first_token_s, now, prefilled_at, item.prompt_tokens)
            if item is new:
                return first_at
            prefilled_at = first_at
            used += item.tokens
            running_in[item.bucket] = running_in.get(item.bucket, 0) + 1
            order += 1
            heapq.heappush(heap, (decoded + max(1.0, item.output_tokens), order, item.tokens,
                                  item.bucket, decoded))
        if not heap:
            return NEVER  # cannot happen while new fits an empty pool; never spin
        finish, _, tokens, bucket, entered = heapq.heappop(heap)
        now += (finish - decoded) * step_s(len(heap) + 1)
        used += (finish - decoded) * (len(heap) + 1)  # every running sequence grew
        decoded = finish
        used -= tokens + (finish - entered)
        running_in[bucket] -= 1


class ProbeGate:
    """While admission refuses by forecast, one request per ``interval_s`` is admitted anyway.

    A refused request teaches nothing: a forecast that became too pessimistic (it learned a
    one-off cost, a slow spell ended) would refuse every later request and never see a first
    token that proves it wrong. A probe is queued like any request; its first token is compared
    with what the forecast said, and the calibration moves by the error
    (:class:`gateway.admission.ForecastStats`). When the forecast was right, a probe costs one
    request per interval that misses the SLO, and teaches that the forecast was right.
    """

    def __init__(self, interval_s: float) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        """``math.inf``: never probe (tests of the forecast alone)."""
        self._last: float | None = None

    def allow(self, now: float) -> bool:
        """True (and the interval restarts) when the last probe was at least ``interval_s``
        ago."""
        if not math.isfinite(self.interval_s):
            return False
        if self._last is not None and now - self._last < self.interval_s:
            return False
        self._last = now
        return True
