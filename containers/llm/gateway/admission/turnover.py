"""KV turnover: when a request that must wait for KV room would have its first token.

The prefill valve (:mod:`gateway.admission.valve`) decides by one rate: prompt tokens waiting ×
seconds per token. A burst on an idle engine does not drain at one rate. The engine starts the
pool's worth at once; the next wave starts only when the first one's answers end and give their
KV blocks back, and the wave after that when the second one's do. So the wait is a step function
of a request's place in the backlog. One rate times one target is a line through those steps:
high enough for the second wave is high enough for the third. The windows that span the gap
between waves also measure a low rate, so each two-wave burst lowered the cap
(docs/design-decisions.md#surge-admission, "What a rate cannot say").

This module predicts the step. It replays what the engine will do, first come, first served:

* **the running requests** end when their answers do. A request with its first token ends after
  its expected output tokens left (:class:`gateway.admission.lengths.OutputLengths`) × the
  **decode step** (seconds per output token of one stream, measured from the answers). One still
  in prefill has its first token after the prompt tokens ahead of it and its own, at the
  **prefill rate**, and then decodes;
* **the queued requests and the new one** are dispatched in order when their prompt blocks (and
  sequences) fit beside what has not ended. Each is then prefilled after the prompts dispatched
  before it, and its first token is the prediction;
* **a request that waited for room decodes after the prefill of those dispatched after it.** A
  step that prefills takes as long as its prompts, and the answers already started get one token
  from it: on the CPU build a wave of 17-20 short chats is prefilled in 0.7-0.9 s while the
  answers begun before it wait. The replay counts that stall for the requests it dispatches after
  a wait (each one's end moves by the prefill of every such request dispatched after it), so the
  wave after next is predicted behind the whole prefill of the one before it. Without it the
  replay put the third wave of a sustained surge of short chats at 1.33-1.49 s where it started at
  2.2-2.5 s, and those requests were every late admission of the run (13 of 262; issue 37,
  sixteenth round). The requests running now and those dispatched at once keep the first model:
  a burst's second wave is predicted as it was, and its error is the valve's target's to absorb
  (docs/design-decisions.md#surge-admission).

A request whose length bucket is at its cap (``GATEWAY_BUCKET_CAPS``) also waits for one of the
bucket's slots, which the pool's room does not show: :func:`slot_free_at` replays the bucket's
own answers, and the controller takes the later of the two waits.

A dispatched request is counted at its expected end-state from dispatch on (it frees that much
when it ends). This is conservative: vLLM admits a prompt beside what the running answers hold
*now*, so the engine starts a wave at least as early as predicted.

The replay also says whether every request it was asked about is dispatched at once. Such a
prediction is the prefill ahead of them alone — no answer's length or decode step in it — and
the controller holds it to the late bound (0.8 of the SLO) where the valve's target is lower. The
target is the valve's feedback on waits for room: a slot-bound surge (a GPU with 64 sequences
and 4 s answers) brings it to its floor, and a burst after it then started 15 of the 64 that
vLLM's server started within the SLO on an H200 (13 of 64 on the simulator shaped like it,
42 with this rule; docs/gateway.md#surges).

The rates are the engine's own, measured where the valve's are not mixed with KV waits:

* the decode step — an answer's time from its first token to its end ÷ its tokens after the
  first, each answer moving the log of the estimate by :data:`STEP_WEIGHT`. A stall (no token
  on any stream for longer than the estimate) counts as the step while it lasts. Whole answers,
  not the gaps between a stream's tokens: the gaps are a few milliseconds of decoding and now
  and then a step that prefilled other prompts, and an answer's end is their sum (a mean of the
  gaps in log space measured 5.5 ms where answers took 12 ms a token, and the replay admitted
  a third wave);
* the prefill rate — a :class:`~gateway.admission.valve.PrefillValve` fed with *dispatched*
  requests only (entered at dispatch, left at the first token): the valve's own windows then
  measure prompt tokens per second of prefill, without the time they waited for KV room. Its
  bound applies too: a dispatched request without its first token for long lowers the rate
  used. Where requests reach the engine a prompt or two a step, those windows measure a step's
  latency per prompt; :class:`PrefillCost` measures the time per prompt token beyond each
  step's fixed cost (the decode step), and the controller predicts with the higher of the two
  rates (full steps at that cost), each of which errs low for a reason of its own, and each at
  the second slowest of its last :data:`~gateway.admission.valve.LOW_SAMPLES` measures, not
  their recent level (see ``AdmissionController.prefill_rate``).

Pure module: standard library only (and the valve's measure).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gateway.admission.valve import LOW_SAMPLES, geometric_step, slow_pick

STEP_WEIGHT = 0.2
"""How far one answer's decode step moves the log of the estimate (a wave of 20 answers moves
it most of the way)."""


@dataclass(frozen=True)
class Holder:
    """A dispatched request, as the replay needs it."""

    end_blocks: int
    """KV blocks it is expected to hold at its end (what it frees then)."""
    sequences: int
    remaining: int
    """Output tokens per choice it is still expected to generate."""
    prefill_tokens: int = 0
    """Prompt tokens still to prefill (0 once it had its first token)."""


@dataclass(frozen=True)
class Candidate:
    """A request waiting for dispatch (queued, or the one being decided)."""

    blocks: int
    """KV blocks it needs at dispatch (its prompt and one token per choice)."""
    end_blocks: int
    sequences: int
    prompt_tokens: int
    output: int
    """Output tokens per choice it is expected to generate."""


def replay(now: float, *, running: Sequence[Holder], queued: Sequence[Candidate],
           pool_blocks: int, max_running: int, step_s: float,
           prefill_rate: float) -> tuple[float, bool]:
    """When the last of ``queued`` would have its first token, replaying dispatch first come,
    first served (see the module docstring; ``inf`` when it never fits), and whether every one
    of ``queued`` is dispatched at ``now`` (none waits for sequences or KV room: the prediction
    is their prefill alone). ``running``: in the order they were dispatched (their prefill is
    first come, first served too)."""
    if not queued:
        raise ValueError("queued must name at least the request being decided")
    if not (step_s > 0 and prefill_rate > 0):
        raise ValueError(f"step_s and prefill_rate must be > 0, got {step_s}, {prefill_rate}")
    free_blocks = pool_blocks
    free_sequences = max_running
    ends: list[tuple[float, int, int]] = []  # (when, blocks, sequences), a heap
    running_ends, prefill_done = holder_ends(now, running, step_s=step_s,
                                             prefill_rate=prefill_rate)
    for holder, ends_at in zip(running, running_ends, strict=True):
        heapq.heappush(ends, (ends_at, holder.end_blocks, holder.sequences))
        free_blocks -= holder.end_blocks
        free_sequences -= holder.sequences
    clock = now
    first = now
    stalled = 0.0  # prefill seconds of the requests that waited for room, so far
    waited: list[tuple[float, int, int]] = []  # their ends, less `stalled` then, a heap
    for candidate in queued:
        while free_blocks < candidate.blocks or free_sequences < candidate.sequences:
            if not ends and not waited:
                return math.inf, False  # more than the whole pool: it never fits
            if waited and (not ends or waited[0][0] + stalled < ends[0][0]):
                when, blocks, sequences = heapq.heappop(waited)
                when += stalled  # decoding, it waited out the prefill of those after it
            else:
                when, blocks, sequences = heapq.heappop(ends)
            clock = max(clock, when)
            free_blocks += blocks
            free_sequences += sequences
        prefilled = candidate.prompt_tokens / prefill_rate
        prefill_done = max(prefill_done, clock) + prefilled
        first = prefill_done
        decoded = max(0, candidate.output - 1) * step_s
        if clock > now:  # it waited for room: a later wave's prefill stalls its answer
            stalled += prefilled
            heapq.heappush(waited, (first - stalled + decoded, candidate.end_blocks,
                                    candidate.sequences))
        else:
            heapq.heappush(ends, (first + decoded, candidate.end_blocks, candidate.sequences))
        free_blocks -= candidate.end_blocks
        free_sequences -= candidate.sequences
    return first, clock == now


def holder_ends(now: float, running: Sequence[Holder], *, step_s: float, prefill_rate: float
                ) -> tuple[list[float], float]:
    """When each running request's answer ends by the replay's first model (in ``running``'s
    order, the order they were dispatched in), and when the last of their prompts still in
    prefill is done (``now`` when none is)."""
    prefill_done = now
    ends: list[float] = []
    for holder in running:
        if holder.prefill_tokens:  # its first token after the prompts ahead of it and its own
            prefill_done += holder.prefill_tokens / prefill_rate
            ends.append(prefill_done + max(0, holder.remaining - 1) * step_s)
        else:
            ends.append(now + max(1, holder.remaining) * step_s)
    return ends, prefill_done


def slot_free_at(now: float, *, running_ends: Iterable[float], queued: Sequence[Candidate],
                 cap: int, step_s: float, prefill_rate: float) -> float:
    """When the last of ``queued`` — requests of one length bucket waiting for dispatch, in
    order — gets one of the bucket's ``cap`` slots (``GATEWAY_BUCKET_CAPS``: at most that many
    of the bucket in flight at once), given when the bucket's running requests end
    (``running_ends``): each request ahead of it takes a slot when one frees and holds it for
    its prefill and its answer. ``now`` when a slot is free for it at once. The KV pool and the
    engine's sequences are :func:`replay`'s; this is the wait a bucket's cap adds to it, which a
    burst of long requests meets before the pool (eight XL requests on a pool that holds ten
    of their prompts: the ninth and tenth were predicted to start at once and waited 2.3 and
    5.2 s for a slot; issue 37, seventeenth round)."""
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    ends = list(running_ends)
    heapq.heapify(ends)
    free = cap - len(ends)
    clock = now
    for candidate in queued:
        while free < 1:
            clock = max(clock, heapq.heappop(ends))
            free += 1
        heapq.heappush(ends, clock + candidate.prompt_tokens / prefill_rate
                       + max(0, candidate.output - 1) * step_s)
        free -= 1
    return clock


STEP_GAP_SHARE = 0.5
"""A stream's token more than this share of the decode step after the one before begins the
outputs of another engine step: a step's outputs reach the streams together (a few milliseconds
apart beside a decode step of 15-70 ms), the next step's a decode step later."""


@dataclass(frozen=True)
class _Wait:
    """A request's wait for its first token, measured once its step's outputs are all in."""

    started: float
    """When its own steps began."""
    ended: float
    """Its first token."""
    step_s: float
    step_tokens: int


class PrefillCost:
    """The engine's prefill as its steps run it: seconds per prompt token beyond each step's
    fixed cost (see the module docstring); None before the first measure.

    A scheduler step costs about the same fixed time whatever it carries (the decode step: the
    weights read once, the running streams' tokens) plus a time per token it prefills. A request
    waits for its first token over the steps that prefill the prompts ahead of it and its own,
    ``ceil(tokens / step_tokens)`` of them, so its wait less that many decode steps is
    ``tokens`` × the per-token time. A rate (tokens ÷ wait) folds the fixed cost into the
    tokens: measured where requests reach the engine one or two a step (a sequence-bound
    surge) it is one step's latency per prompt, a quarter of what a full step prefills on an
    H200, and the replay then put a burst's 64th first token at 4.9 s where vLLM's server
    started all 64 within 1.5 s.

    **The tokens** are those the steps of its wait prefilled: the prompts whose first tokens
    came after its own steps began, up to and with its own step's outputs (those within
    :data:`STEP_GAP_SHARE` of a decode step after its first token) — the prompts ahead of it,
    its own, and those dispatched after it that its step prefilled beside it. So a wait is
    measured once its step's outputs are all in: at the next stream token or first token after
    them.

    **The step in progress.** A request dispatched while the engine runs a step (streams are
    decoding) is scheduled in the step after it, so its wait also holds what was left of that
    step: anything up to a decode step more than its prompt takes (66 ms beside a 260-token
    prompt on the H200 shape: up to 254 us a token on top of 38), and on the CPU build, where a
    step that prefills runs far longer than the decode step, most of a second. Such a request's
    wait is therefore timed from the end of that step, which the streams show: their next
    tokens, the first more than :data:`STEP_GAP_SHARE` of the decode step after the one before
    (:meth:`token`); the prompts that step prefilled are not in its tokens. Timed from dispatch,
    the estimate after a sequence-bound surge was 93 us a token on the simulator shaped like the
    H200, and a burst after it started 49 of the 64 vLLM's server starts. Timed from at most a
    decode step after dispatch over every token ahead at dispatch (the code before), a request
    dispatched during a long step had most of that step in its wait and all of its prompts in
    its tokens: on the CPU build (a step with four 270-token prompts beside 17 streams took
    0.73-0.8 s, the decode step 63 ms) the cost learned was 360-450 us a token where the steps
    took about 690 (2,500 tokens a second predicted, about 1,450 prefilled), and the requests
    admitted to wait for room in a sustained surge of short chats started up to 2.2x later than
    predicted (issue 37, nineteenth round)."""

    def __init__(self, *, weight: float = STEP_WEIGHT) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        self.weight = weight
        self.token_s: float | None = None
        self._recent: deque[float] = deque(maxlen=LOW_SAMPLES)
        """The latest measures of seconds per token (:meth:`rate`'s ``slowest``)."""
        self._started: dict[int, float] = {}
        """When each dispatched request's own steps began (by its key), until its first token."""
        self._in_step: dict[int, float] = {}
        """Requests dispatched while a step ran (their dispatch time), until its outputs."""
        self._open: list[_Wait] = []
        """Waits whose step's outputs may still be arriving."""
        self._firsts: deque[tuple[float, int]] = deque()
        """(when, prompt tokens) of the first tokens an open or future wait may count."""

    def dispatched(self, key: int, now: float, *, stepping: bool) -> None:
        """Request ``key`` was dispatched at ``now``; ``stepping``: while streams were decoding
        (a step in progress that it waits out before its own)."""
        if stepping:
            self._in_step[key] = now
        else:
            self._started[key] = now

    def token(self, now: float, *, previous_at: float | None, step_s: float | None) -> None:
        """A stream had a token at ``now``, the one before at ``previous_at``: the waits whose
        step's outputs are all in are measured; where it begins another step's outputs, the
        requests dispatched during the step that ended start their own steps now."""
        self._measure(now)
        if not self._in_step or step_s is None:
            return
        if previous_at is not None and now - previous_at <= STEP_GAP_SHARE * step_s:
            return  # the same step's outputs
        for key in self._in_step:
            self._started[key] = now
        self._in_step.clear()

    def first_token(self, key: int, now: float, *, prompt_tokens: int, step_s: float | None,
                    step_tokens: int, learn: bool = True) -> None:
        """Request ``key``, of ``prompt_tokens``, had its first token at ``now``, while the
        decode step was ``step_s``: its wait from when its steps began (from its dispatch when no
        step's outputs came between: its own token ended the step) is measured once its step's
        outputs are all in. A wait within the steps' fixed cost (a step faster than the decode
        step: nothing was decoding) teaches nothing, as does one before the decode step is
        known, or one with ``learn`` off (warmup's first pass)."""
        self._measure(now)
        started = self._started.pop(key, None)
        in_step = self._in_step.pop(key, None)
        if started is None:
            started = in_step
        self._firsts.append((now, max(0, prompt_tokens)))
        if learn and started is not None and step_s is not None and step_tokens > 0:
            self._open.append(_Wait(started, now, step_s, step_tokens))
        self._prune()

    def _measure(self, now: float) -> None:
        """Learn from the open waits whose step's outputs came before ``now``."""
        still: list[_Wait] = []
        for wait in self._open:
            gap = STEP_GAP_SHARE * wait.step_s
            if now <= wait.ended + gap:
                still.append(wait)
                continue
            tokens = sum(prompt for at, prompt in self._firsts
                         if wait.started + gap < at <= wait.ended + gap)
            if tokens <= 0:
                continue
            fixed = math.ceil(tokens / wait.step_tokens) * wait.step_s
            per_token = (wait.ended - wait.started - fixed) / tokens
            if per_token > 0:
                self.token_s = geometric_step(self.token_s, per_token, self.weight)
                self._recent.append(per_token)
        self._open = still
        self._prune()

    def _prune(self) -> None:
        """Forget the first tokens before every open or future wait's start."""
        oldest = min([wait.started for wait in self._open] + list(self._started.values())
                     + list(self._in_step.values()), default=math.inf)
        firsts = self._firsts
        while firsts and firsts[0][0] <= oldest:
            firsts.popleft()

    def forget(self, key: int) -> None:
        """Request ``key`` ended without a first token (failed, cancelled)."""
        self._started.pop(key, None)
        self._in_step.pop(key, None)
        self._prune()

    def rate(self, step_s: float | None, step_tokens: int, *, slowest: bool = False
             ) -> float | None:
        """Prompt tokens a second in full steps of ``step_tokens`` each costing ``step_s`` more
        than their tokens; None before a measure (or without a step). ``slowest``: at the
        :data:`~gateway.admission.valve.LOW_RANK`-th highest cost per token of the last
        :data:`~gateway.admission.valve.LOW_SAMPLES` measures, not at their recent level."""
        if self.token_s is None or step_s is None or step_tokens <= 0:
            return None
        picked = slow_pick(self._recent, slow_is_high=True) if slowest else None
        token_s = self.token_s if picked is None else picked
        return 1.0 / (token_s + step_s / step_tokens)

    def reset(self) -> None:
        """Forget the estimate and the requests being timed (a new engine)."""
        self.token_s = None
        self._recent.clear()
        self._started.clear()
        self._in_step.clear()
        self._open.clear()
        self._firsts.clear()


SO_FAR_TOKENS = 8
"""An answer still running counts toward the decode step so far once it has this many tokens
after its first (one or two steps are mostly the step that prefilled it)."""


def step_so_far(now: float, answers: Iterable[tuple[float, int]]) -> float | None:
    """The decode step the answers still running show before any has ended: their time since
    the first token over their tokens after it (``answers``: each one's first token time and
    tokens per choice so far), over those with at least :data:`SO_FAR_TOKENS` after the first;
    None without one. On a GPU with 64 sequences and 4 s answers the first answer ends 4 s into
    a surge, and until then the replay could not say that the 65th request waits that long
    for a sequence: the valve admitted it by its cap, and 13 of the simulator's surge's
    requests started late (docs/gateway.md#surges)."""
    elapsed = 0.0
    tokens = 0
    for first_token_at, produced in answers:
        if produced - 1 >= SO_FAR_TOKENS:
            elapsed += now - first_token_at
            tokens += produced - 1
    return elapsed / tokens if tokens else None


class DecodeStep:
    """The engine's decode step as the answers show it: seconds per output token of one stream
    (see the module docstring); None before the first answer."""

    def __init__(self, *, weight: float = STEP_WEIGHT) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        self.weight = weight
        self.step_s: float | None = None
        self.last_token_at: float | None = None
        """When any stream last had a token (a stall is measured from it)."""

    def answer(self, decode_s: float, tokens: int) -> None:
        """An answer ended ``decode_s`` after its first token, with ``tokens`` tokens (per
        choice) in all: ``tokens - 1`` decode steps (one token alone teaches nothing)."""
        if tokens < 2 or decode_s <= 0:
            return
        self.step_s = geometric_step(self.step_s, decode_s / (tokens - 1), self.weight)

    def token(self, now: float) -> None:
        """A stream had a token at ``now`` (a stall is measured from the last one)."""
        self.last_token_at = now

    def now_s(self, now: float, *, decoding: bool) -> float | None:
        """The step to predict with at ``now``: the estimate, or the stall since the last token
        when ``decoding`` streams have had none for longer."""
        step = self.step_s
        if step is None:
            return None
        if decoding and self.last_token_at is not None:
            step = max(step, now - self.last_token_at)
        return step

    def reset(self) -> None:
        """Forget the estimate (a new engine)."""
        self.step_s = None
        self.last_token_at = None
