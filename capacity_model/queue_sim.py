"""The first-token tail of the real mix: vLLM's chunked-prefill scheduler simulated step by step.

:mod:`capacity_model.roofline` gives closed-form latencies for the mix's *mean* request; a
mean prompt hides the queue a 2,900-token XL prefill builds in front of everybody else, and the
queue the others build in front of it. This module runs the same engine — the same roofline
step time (:func:`capacity_model.roofline.step_seconds`), the same token budget — on a closed
loop of ``B`` requests drawn from the mix's own buckets (each its own uncached prompt and
answer), and reads the quantiles off the simulated requests:

* **a step** decodes one token of every running request and fills the rest of the token budget
  (``max_num_batched_tokens`` minus those decodes) with prompt chunks, first come first served
  (vLLM's scheduler: running requests first, then the waiting queue in arrival order); its
  duration is ``step_seconds(decodes, prompt tokens)``;
* **a request** arrives, waits for the step in progress (a replacement is sent when an answer
  ends and lands a uniform share into the next step: the client's round trip), waits for the
  prompt chunks ahead of it, prefills its own uncached tokens chunk by chunk and samples its
  first token at the end of its last chunk's step; then it decodes one token a step until its
  answer is done, and a new request (bucket drawn by share) takes its place;
* **a front end** (``front_end_s``, 0 for the plan): the per-request work in front of the engine
  that one request at a time gets (HTTP, the gateway's event loop rendering and tokenizing the
  prompt) — a FIFO server each request passes through before it joins the engine's queue. On a
  GPU host it is small beside a step and the plan leaves it out; on the CPU check it is the
  largest part of a short request's first token, and simultaneous arrivals queue for it;
* **shared cores** (``shared_cores_s``, 0 for the plan): the host work each request takes from
  the engine's own cores (on the CPU check: the front end, and the benchmark client beside it).
  It joins a backlog of host work that shares the cores with the engine, one for one: a step
  of ``d`` seconds lasts ``d + min(backlog, d)`` and takes that much off the backlog, and an
  idle engine leaves the cores to it. A cluster of arrivals slows the next few steps, not one
  (charging a request's whole work to the step it arrives in made Poisson clusters into long
  steps: the CPU check's open loops read 1.44 × slow at the median);
* **open loops** (:func:`simulate_open`): Poisson arrivals at a rate instead of a closed loop —
  a request's end sends nothing, and the figures include the queue that random arrivals build;
* **jitter** of an unloaded engine (``ttft_p99_over_p50``, ``tpot_p99_over_p50``: p99 over p50
  with nobody queued) multiplies each request's own prefill time and its per-token time by a
  log-normal factor of median 1 whose p99 is that ratio. The queue's tail is the simulation's.

Deterministic for a given ``seed`` (``random.Random``). The first ``2 × B`` requests (the loop
filling from empty) are discarded.

Pure module: standard library only.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from capacity_model.roofline import RooflineInputs, step_seconds

Z99 = 2.326
DEFAULT_REQUESTS = 6000
DEFAULT_SEED = 39
ANSWER_SPREAD = 0.5
"""How much answers of one bucket vary around its typical length (uniform ± this share) —
this project's assumption until the request log's ``usage.completion_tokens`` measures it.
Without it a closed loop of identical requests moves in lock-step waves (every replacement
arrives with the others of its wave), which no traffic does."""


class SimulationError(ValueError):
    """Inputs the simulation cannot run; the message names the field and value."""


@dataclass(frozen=True)
class RequestClass:
    """One bucket's typical request: its share, the prompt tokens it prefills, its answer."""

    bucket: str
    share: float
    uncached_tokens: float
    output_tokens: int
    spread: float = ANSWER_SPREAD
    """Answers vary uniformly within ``output_tokens × (1 ± spread)`` (0: all alike)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.spread) and 0 <= self.spread < 1):
            raise SimulationError(f"request class {self.bucket} spread: {self.spread!r}; "
                                  "accepted: 0 <= spread < 1")
        if not (math.isfinite(self.share) and 0 < self.share <= 1):
            raise SimulationError(f"request class {self.bucket} share: {self.share!r}; "
                                  "accepted: (0, 1]")
        if not (math.isfinite(self.uncached_tokens) and self.uncached_tokens >= 1):
            raise SimulationError(f"request class {self.bucket} uncached_tokens: "
                                  f"{self.uncached_tokens!r}; accepted: >= 1")
        if self.output_tokens < 1:
            raise SimulationError(f"request class {self.bucket} output_tokens: "
                                  f"{self.output_tokens!r}; accepted: >= 1")


@dataclass(frozen=True)
class Quantiles:
    """p50 and p99 (and p99.9 where computed) of one figure, milliseconds."""

    p50_ms: float
    p99_ms: float
    p999_ms: float | None = None
    """The nearest-rank p99.9 of the simulated requests (the first tokens'): of the default
    6,000 requests, the 7th slowest — the queue's own tail, with its sampling noise."""


@dataclass(frozen=True)
class SimResult:
    """What the simulated closed loop of ``batch_size`` requests did."""

    batch_size: int
    requests: int
    ttft: Quantiles
    """Over all measured requests."""
    ttft_by_bucket: tuple[tuple[str, Quantiles], ...]
    tpot: Quantiles
    """Each request's mean time per output token after the first, over the requests."""
    request_s: float
    """Mean arrival-to-last-token time."""
    throughput_per_min: float
    in_flight: float = 0.0
    """Requests between arrival and last token, on average over the measured span (Little's
    L: for a closed loop its batch, for an open loop what the arrivals keep in flight)."""

    def ttft_of(self, bucket: str) -> Quantiles:
        """The first-token quantiles of ``bucket``'s requests."""
        return next(q for name, q in self.ttft_by_bucket if name == bucket)


@dataclass
class _Request:
    klass: RequestClass
    arrival_s: float
    remaining: float
    index: int
    output_tokens: int
    started_s: float = -1.0
    first_token_s: float = 0.0


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``values`` (sorted or not)."""
    if not values:
        raise SimulationError("quantile of no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


class _Loop:
    """The closed loop's state; :func:`simulate` drives it."""

    def __init__(self, inputs: RooflineInputs, classes: Sequence[RequestClass],
                 batch_size: int, seed: int, front_end_s: float = 0.0,
                 shared_cores_s: float = 0.0) -> None:
        self.inputs = inputs
        self.front_end_s = front_end_s
        self.shared_cores_s = shared_cores_s
        self.taken_s = 0.0  # host work done on the engine's cores since the last step
        self.front_free_s = 0.0
        self.open_rate = 0.0
        self.next_open_s = math.inf
        self.classes = tuple(classes)
        total = sum(c.share for c in classes)
        running, self.cumulative = 0.0, []
        for klass in classes:
            running += klass.share / total
            self.cumulative.append(running)
        self.rng = random.Random(seed)
        self.batch_size = batch_size
        self.waiting: deque[_Request] = deque()
        self.decoding: list[tuple[int, int, _Request]] = []
        self.pending: list[tuple[float, _Request]] = []
        self.now = 0.0
        self.step = 0
        self.arrivals = 0
        self.done: list[tuple[_Request, float]] = []
        self.warmup = 2 * batch_size
        self.measured = 0

    def draw(self) -> RequestClass:
        """A bucket by share."""
        position = bisect.bisect_left(self.cumulative, self.rng.random())
        return self.classes[min(position, len(self.classes) - 1)]

    def answer_tokens(self, klass: RequestClass) -> int:
        """The answer's length: uniform within the bucket's mean ± its spread."""
        if klass.spread == 0:
            return klass.output_tokens
        drawn = klass.output_tokens * (1 + klass.spread * (2 * self.rng.random() - 1))
        return max(1, round(drawn))

    def arrive(self, at_s: float) -> None:
        """A new request, drawn from the mix, arriving at ``at_s``; it joins the engine's queue
        once the front end has handled it (after those that arrived before it)."""
        klass = self.draw()
        request = _Request(klass, at_s, klass.uncached_tokens, self.arrivals,
                           self.answer_tokens(klass))
        self.arrivals += 1
        self.taken_s += self.shared_cores_s
        if self.front_end_s > 0:
            self.front_free_s = max(at_s, self.front_free_s) + self.front_end_s
            self.pending.append((self.front_free_s, request))
        else:
            self.pending.append((at_s, request))

    def open_arrivals(self) -> None:
        """In an open loop, every Poisson arrival up to now (or, with the engine idle, up to
        the next one)."""
        if not self.open_rate:
            return
        if not self.waiting and not self.decoding and not self.pending:
            self.idle_until(self.next_open_s)
        while self.next_open_s <= self.now:
            self.arrive(self.next_open_s)
            self.next_open_s += self.rng.expovariate(self.open_rate)

    def idle_until(self, at_s: float) -> None:
        """The engine waits, with nothing to run, until ``at_s``; the host's pending work runs
        meanwhile on the cores the engine leaves."""
        resume = max(self.now, at_s)
        self.taken_s = max(0.0, self.taken_s - (resume - self.now))
        self.now = resume

    def run_step(self) -> None:
        """Admit what has arrived, run one step, retire what finished. An idle engine waits
        for the next request instead of stepping."""
        self.open_arrivals()
        if not self.waiting and not self.decoding and self.pending:
            self.idle_until(min(at_s for at_s, _ in self.pending))
        for at_s, request in self.pending:
            if at_s <= self.now:
                self.waiting.append(request)
        self.pending = [(at, r) for at, r in self.pending if at > self.now]
        decodes = len(self.decoding)
        budget = max(1.0, self.inputs.max_num_batched_tokens - decodes)
        chunk_tokens, finished_prefill = 0.0, []
        for request in self.waiting:
            if budget <= 0:
                break
            take = min(budget, request.remaining)
            if request.started_s < 0:
                request.started_s = self.now
            request.remaining -= take
            chunk_tokens += take
            budget -= take
            if request.remaining <= 1e-9:
                finished_prefill.append(request)
        nominal = step_seconds(self.inputs, decodes, chunk_tokens)
        shared = min(self.taken_s, nominal)
        duration = nominal + shared
        self.taken_s -= shared
        self.now += duration
        for request in finished_prefill:
            self.waiting.popleft()
            request.first_token_s = self.now
            heapq.heappush(self.decoding, (self.step + request.output_tokens - 1,
                                           request.index, request))
        while self.decoding and self.decoding[0][0] <= self.step:
            _, _, request = heapq.heappop(self.decoding)
            self.done.append((request, self.now))
            if request.index >= self.warmup:
                self.measured += 1
            if not self.open_rate:
                self.arrive(self.now + self.rng.random() * duration)
        self.step += 1


def _jitter(rng: random.Random, ratio: float) -> float:
    """A log-normal factor of median 1 whose p99 is ``ratio``."""
    return math.exp(rng.gauss(0.0, math.log(ratio) / Z99)) if ratio > 1 else 1.0


def simulate(inputs: RooflineInputs, classes: Sequence[RequestClass], batch_size: int, *,
             requests: int = DEFAULT_REQUESTS, seed: int = DEFAULT_SEED,
             front_end_s: float = 0.0, shared_cores_s: float = 0.0) -> SimResult:
    """Run the closed loop until ``requests`` have finished after the warm-up (module
    docstring) and return their quantiles; ``front_end_s`` is the serial per-request work in
    front of the engine, ``shared_cores_s`` the host work a request takes from the engine's
    cores (module docstring).

    Remembered per process (the inputs are frozen, the result is frozen and deterministic for
    them): a plan re-solves its reuse at the same batch sizes, and every environment load of a
    process re-makes the same plan, each simulation taking a quarter of a second."""
    return _simulate(inputs, tuple(classes), batch_size, requests, seed, front_end_s, 0.0,
                     shared_cores_s)


def simulate_open(inputs: RooflineInputs, classes: Sequence[RequestClass], per_second: float,
                  *, requests: int = DEFAULT_REQUESTS, seed: int = DEFAULT_SEED,
                  front_end_s: float = 0.0, shared_cores_s: float = 0.0) -> SimResult:
    """Poisson arrivals at ``per_second`` (an open loop: nothing waits for an answer before
    sending) until ``requests`` have finished after the warm-up (the first ``requests`` / 10);
    ``batch_size`` of the result is 0. SimulationError for a rate the engine cannot keep up
    with (its queue would grow without bound): the loop stalls at a backlog of ``requests``."""
    if not (math.isfinite(per_second) and per_second > 0):
        raise SimulationError(f"per_second: {per_second!r}; accepted: a rate > 0")
    return _simulate(inputs, tuple(classes), 0, requests, seed, front_end_s, per_second,
                     shared_cores_s)


@functools.lru_cache(maxsize=1024)
def _simulate(inputs: RooflineInputs, classes: tuple[RequestClass, ...], batch_size: int,
              requests: int, seed: int, front_end_s: float, per_second: float,
              shared_cores_s: float) -> SimResult:
    if batch_size < 1 and not per_second:
        raise SimulationError(f"batch_size: {batch_size!r}; accepted: >= 1")
    if requests < 100:
        raise SimulationError(f"requests: {requests!r}; accepted: >= 100")
    if not classes:
        raise SimulationError("classes: accepted: at least one request class")
    if not (math.isfinite(front_end_s) and front_end_s >= 0):
        raise SimulationError(f"front_end_s: {front_end_s!r}; accepted: >= 0 seconds")
    if not (math.isfinite(shared_cores_s) and shared_cores_s >= 0):
        raise SimulationError(f"shared_cores_s: {shared_cores_s!r}; accepted: >= 0 seconds")
    loop = _Loop(inputs, classes, batch_size, seed, front_end_s, shared_cores_s)
    if per_second:
        loop.open_rate, loop.warmup = per_second, requests // 10
        loop.next_open_s = loop.rng.expovariate(per_second)
    for _ in range(batch_size):
        loop.arrive(0.0)
    warmup = loop.warmup
    while loop.measured < requests:
        before = len(loop.done)
        for _ in range(256):
            loop.run_step()
        if len(loop.done) == before and not loop.decoding and not loop.waiting:
            raise SimulationError("the loop stalled")
        if per_second and len(loop.waiting) + len(loop.pending) > requests:
            raise SimulationError(f"arrivals at {per_second:g}/s outrun the engine: "
                                  f"{len(loop.waiting) + len(loop.pending)} requests queued")
    measured = [(r, end) for r, end in loop.done if r.index >= warmup][:requests]
    return _summarize(inputs, measured, batch_size, random.Random(seed + 1))


def _summarize(inputs: RooflineInputs, measured: list[tuple[_Request, float]],
               batch_size: int, rng: random.Random) -> SimResult:
    ttfts: dict[str, list[float]] = {}
    everyone, tpots, durations = [], [], []
    for request, end in measured:
        own = request.first_token_s - request.started_s
        ttft = (request.started_s - request.arrival_s
                + own * _jitter(rng, inputs.ttft_p99_over_p50))
        ttfts.setdefault(request.klass.bucket, []).append(ttft)
        everyone.append(ttft)
        steps = request.output_tokens - 1
        if steps > 0:
            tpots.append((end - request.first_token_s) / steps
                         * _jitter(rng, inputs.tpot_p99_over_p50))
        durations.append(end - request.arrival_s)
    first = min(r.arrival_s for r, _ in measured)
    last = max(end for _, end in measured)
    return SimResult(
        batch_size=batch_size, requests=len(measured),
        ttft=_quantiles(everyone, tail=True),
        ttft_by_bucket=tuple((name, _quantiles(values)) for name, values in ttfts.items()),
        tpot=_quantiles(tpots) if tpots else Quantiles(0.0, 0.0),
        request_s=sum(durations) / len(durations),
        throughput_per_min=60 * len(measured) / max(last - first, 1e-9),
        in_flight=sum(durations) / max(last - first, 1e-9))


def _quantiles(seconds: Sequence[float], *, tail: bool = False) -> Quantiles:
    """p50 and p99 in milliseconds; with ``tail``, p99.9 too (only over all requests: a
    bucket's share of them is too few for it)."""
    return Quantiles(round(1000 * quantile(seconds, 0.5), 1),
                     round(1000 * quantile(seconds, 0.99), 1),
                     round(1000 * quantile(seconds, 0.999), 1) if tail else None)


def slo_limit(inputs: RooflineInputs, classes: Sequence[RequestClass], *, ttft_p99_ms: float,
              tpot_p99_ms: float, max_batch: int, start: int | None = None,
              requests: int = DEFAULT_REQUESTS, seed: int = DEFAULT_SEED,
              front_end_s: float = 0.0, shared_cores_s: float = 0.0) -> tuple[int, SimResult]:
    """The largest batch (up to ``max_batch``) whose simulated TTFT p99 over all requests and
    TPOT p99 meet the SLOs, and the simulation there; 0 and the batch-1 run when even one
    request misses them. ``start`` is a first guess (the closed form's limit): the search walks
    from it, assuming the tails grow with the batch."""

    def meets(size: int) -> tuple[bool, SimResult]:
        result = simulate(inputs, classes, size, requests=requests, seed=seed,
                          front_end_s=front_end_s, shared_cores_s=shared_cores_s)
        return (result.ttft.p99_ms <= ttft_p99_ms and result.tpot.p99_ms <= tpot_p99_ms,
                result)

    low, high = 0, max_batch + 1
    guess = min(max(1, start or max_batch // 2), max_batch)
    runs: dict[int, SimResult] = {}
    while high - low > 1:
        size = guess if low < guess < high else (low + high) // 2
        ok, runs[size] = meets(size)
        if ok:
            low = size
        else:
            high = size
        guess = size + 2 if ok else size - 2
    if low == 0:
        return 0, runs.get(1) or simulate(inputs, classes, 1, requests=requests, seed=seed,
                                          front_end_s=front_end_s, shared_cores_s=shared_cores_s)
    return low, runs[low]
