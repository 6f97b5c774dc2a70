"""KV turnover (gateway.admission.turnover): the replay that predicts when a request waiting for
KV room has its first token, the decode step it predicts with, and how the controller decides
with it beside the prefill valve (docs/design-decisions.md#surge-admission, "The turnover")."""

from __future__ import annotations

import asyncio
import math

import pytest

from gateway.admission import (
    AdmissionController,
    AdmissionLedger,
    AdmissionRejected,
    AdmissionRequest,
    LengthBucket,
    ScreenPass,
    turnover,
)
from gateway.admission.turnover import Candidate, DecodeStep, Holder, PrefillCost, slot_free_at
from gateway.engines.base import KvCapacity
from request_buckets import bucket_bounds
from tests.containers.llm.test_admission import FakeClock, request

STEP_S = 0.01
RATE = 10_000.0


def wave(count: int, *, prompt: int = 250, output: int = 64) -> list[Candidate]:
    """``count`` requests of ``prompt`` tokens: 16 blocks of 16 at dispatch, 20 at the end."""
    return [Candidate(blocks=16, end_blocks=20, sequences=1, prompt_tokens=prompt, output=output)
            for _ in range(count)]


def replay(queued: list[Candidate], running: list[Holder] | None = None, *, pool: int = 100,
           max_running: int = 64) -> float:
    return turnover.replay(0.0, running=running or [], queued=queued, pool_blocks=pool,
                           max_running=max_running, step_s=STEP_S, prefill_rate=RATE)[0]


def test_what_fits_is_prefilled_first_come_first_served() -> None:
    """Five requests fit a pool of 100 blocks at their end (20 each): the last has its first
    token after all five prompts at the prefill rate."""
    assert replay(wave(5)) == pytest.approx(5 * 250 / RATE)


def test_the_next_wave_starts_when_the_first_one_ends() -> None:
    """The sixth waits for the first one's answer: its prefill (0.025 s) and 63 more tokens at
    the decode step, then its own prefill."""
    first_ends = 250 / RATE + 63 * STEP_S
    assert replay(wave(6)) == pytest.approx(first_ends + 250 / RATE)


def test_a_burst_waits_in_steps_two_waves_within_the_slo_and_not_three() -> None:
    """The step function a rate cannot express: requests 6-10 wait for the first wave's answers
    and have their first tokens within 0.8 s, each 25 ms after the one before; the eleventh
    waits for the second wave's answers too, more than half a second after the tenth. A line
    through the first two waves puts it 25 ms after the tenth."""
    ninth, tenth, eleventh = (replay(wave(count)) for count in (9, 10, 11))
    assert tenth < 0.8
    assert tenth - ninth == pytest.approx(0.025)
    assert eleventh - tenth > 0.5


def test_a_wave_that_waited_for_room_decodes_after_the_prefill_of_those_after_it() -> None:
    """Requests 6-10 wait for the first wave's answers and are prefilled one after another; the
    engine's steps prefill them while the answers already started wait (a step that prefills
    takes as long as its prompts), so the sixth's answer ends 4 × 25 ms later than its own
    first token and 63 steps say, and the eleventh, waiting for it, starts that much later
    (sixteenth round: the replay put the third wave of a sustained surge at 1.33-1.49 s, and
    it started at 2.2-2.5 s). The first wave, dispatched at once, is not stalled this way: a
    burst's second wave is predicted as before."""
    sixth_first = 250 / RATE + 63 * STEP_S + 250 / RATE
    assert replay(wave(6)) == pytest.approx(sixth_first)
    sixth_ends = sixth_first + 63 * STEP_S + 4 * 250 / RATE
    assert replay(wave(11)) == pytest.approx(sixth_ends + 250 / RATE)


def test_running_answers_end_after_what_they_have_left() -> None:
    """A running request with 10 tokens left frees its 20 blocks after 10 steps; one still in
    prefill first drains its prompt, then decodes all of its output."""
    decoding = [Holder(end_blocks=20, sequences=1, remaining=10) for _ in range(5)]
    assert replay(wave(1), decoding) == pytest.approx(10 * STEP_S + 250 / RATE)
    prefilling = [Holder(end_blocks=20, sequences=1, remaining=64, prefill_tokens=250)
                  for _ in range(5)]
    first_ends = 250 / RATE + 63 * STEP_S
    assert replay(wave(1), prefilling) == pytest.approx(first_ends + 250 / RATE)


def test_sequences_are_a_limit_as_blocks_are() -> None:
    """max_running 2: the third waits for a slot though the pool has room."""
    ends = 250 / RATE + 63 * STEP_S
    assert replay(wave(3), pool=10_000, max_running=2) == pytest.approx(ends + 250 / RATE)


def test_the_replay_says_whether_every_request_is_dispatched_at_once() -> None:
    """Five fit the pool beside nothing: at once; the sixth waits for an answer's blocks."""
    def at_once(count: int) -> bool:
        return turnover.replay(0.0, running=[], queued=wave(count), pool_blocks=100,
                               max_running=64, step_s=STEP_S, prefill_rate=RATE)[1]

    assert at_once(5) and not at_once(6)


def test_more_than_the_whole_pool_never_fits() -> None:
    assert math.isinf(replay([Candidate(blocks=200, end_blocks=220, sequences=1,
                                        prompt_tokens=3000, output=10)]))
    with pytest.raises(ValueError, match="queued"):
        replay([])


def test_the_decode_step_is_whole_answers_and_a_stall_counts() -> None:
    """An answer of 65 tokens that took 0.64 s after its first: 10 ms a token. No token on any
    stream for 0.5 s while streams decode: 0.5 s is the step until one comes."""
    step = DecodeStep()
    assert step.now_s(0.0, decoding=True) is None
    step.answer(0.64, 65)
    assert step.step_s == pytest.approx(0.01)
    step.answer(1.0, 1)  # one token: no step measured
    assert step.step_s == pytest.approx(0.01)
    step.token(10.0)
    assert step.now_s(10.005, decoding=True) == pytest.approx(0.01)
    assert step.now_s(10.5, decoding=True) == pytest.approx(0.5)
    assert step.now_s(10.5, decoding=False) == pytest.approx(0.01)


SHORT = AdmissionRequest(bucket=request(300).bucket, prompt_tokens=250, max_tokens=64)


def ledger(blocks: int) -> AdmissionLedger:
    """A pool of ``blocks`` of 16 whose buckets' caps never bind: the pool and the sequences
    are what these requests wait for."""
    return AdmissionLedger(KvCapacity(blocks, 16), watermark=0.9,
                           bucket_caps=dict.fromkeys(("S", "M", "L", "XL"), 1000))


def burst_controller(clock: FakeClock, *, blocks: int = 100, prefill_rate: float = RATE,
                     step_tokens: int = 0) -> AdmissionController:
    """A pool of 100 blocks of 16 (five 250-token requests at their end), an engine that
    prefills 10,000 tokens a second and decodes a token every 15 ms, and a valve whose rate
    (1,000 a second, measured across the gaps between waves) caps the backlog at 1,400
    tokens: five requests. ``blocks`` and ``prefill_rate`` change the pool and the prefill;
    ``step_tokens`` is the engine's step (0: unknown, no :class:`PrefillCost`)."""
    admission = AdmissionController(ledger(blocks=blocks), ttft_slo_s=2.0, max_running=64,
                                    clock=clock, prior_rate=1000.0, step_tokens=step_tokens)
    admission.prefill.reset(prefill_rate)
    admission.decode.answer(63 * 0.015, 64)
    for _ in range(30):
        admission.lengths.observe(64, capped=False)
    return admission


async def offer(admission: AdmissionController, count: int) -> list[bool]:
    """``count`` short requests, one after another, each decided (and dispatched or queued)
    before the next: whether each was admitted. The admitted ones are cancelled at the end."""
    admitted: list[bool] = []
    tasks = []
    for _ in range(count):
        task = asyncio.ensure_future(admission.acquire(SHORT, max_wait_s=5.0))
        await asyncio.sleep(0)  # decided now
        refused = task.done() and isinstance(task.exception(), AdmissionRejected)
        admitted.append(not refused)
        if not refused:
            tasks.append(task)
    for task in tasks:
        task.cancel()
    return admitted


def test_the_turnover_admits_the_next_wave_over_the_valves_cap_and_refuses_the_one_after() -> None:
    """Twenty requests at once on an idle engine: the valve's cap takes five, and the engine
    six (their prompts fit the pool beside each other; the replay counts five at their end);
    the turnover predicts the second wave's first tokens at 1.0-1.1 s (the first wave's answers
    end at 0.97-1.07 s), within the 1.4 s target, and admits the sixth and the second wave over
    the cap; the third wave's would come at 2.09 s, and it is refused."""
    async def scenario() -> tuple[list[bool], AdmissionController]:
        admission = burst_controller(FakeClock())
        return await offer(admission, 20), admission

    outcomes, admission = asyncio.run(scenario())
    assert outcomes == [True] * 11 + [False] * 9, outcomes
    assert admission.arrivals.turnover_admits == 6  # the sixth and the second wave, over the cap
    assert admission.arrivals.refused_by_valve == 9


def test_what_waits_for_room_is_held_to_the_target_whatever_the_cap_says() -> None:
    """The valve's rate is too high for a burst (50,000 a second: a cap of 70,000 tokens), and
    answers take 13 ms a token. The first wave starts at once, the cap's to decide; what waits
    for KV room is the turnover's: the second wave (first tokens at 0.87-0.99 s) is within the
    1.4 s target, the third wave's (1.84 s) within the SLO but not the target, and it is
    refused. A rate is the wrong measure of a wait for room; admitted on it, such requests
    waited 1.9-3.0 s where the replay said 1.3-1.9 s, at the start of a sustained surge of
    short chats at 4x on vLLM's CPU build (docs/gateway.md#surges, fourteenth round)."""
    async def scenario() -> tuple[int, AdmissionController]:
        admission = burst_controller(FakeClock())
        admission.valve.reset(50_000.0)
        admission.decode.reset()
        admission.decode.answer(63 * 0.013, 64)
        return sum(await offer(admission, 30)), admission

    admitted, admission = asyncio.run(scenario())
    assert admitted == 11, admitted
    assert admission.arrivals.turnover_refusals == 19


def test_a_first_wave_that_starts_at_once_is_admitted_to_the_late_bound_not_the_target(
) -> None:
    """Eighty requests at once on an idle engine with 64 sequences and room for all of them,
    after a slot-bound surge left the target at its floor (0.5 s) and the valve's cap at two
    requests: the replay puts the k-th first token after k prompts at 10,400 tokens a second
    (the 64th at 1.54 s) and dispatches every one of the 64 at once, so their prediction is
    their prefill alone and is held to the late bound (0.8 of the SLO), as vLLM's server starts
    all of them within it; the 65th waits for a sequence and is held to the target. Against
    the target alone 20 were admitted (on an H200, 15 where vLLM started 64)."""
    async def scenario() -> tuple[list[bool], AdmissionController]:
        admission = burst_controller(FakeClock(), blocks=64 * 20, prefill_rate=10_400.0)
        admission.valve.target_s = 0.5
        return await offer(admission, 80), admission

    outcomes, admission = asyncio.run(scenario())
    assert outcomes == [True] * 64 + [False] * 16, outcomes.count(True)
    assert admission.arrivals.turnover_admits == 64 - 2  # the floor and the cap took two


def test_the_prefill_cost_is_the_wait_beyond_the_steps_fixed_cost() -> None:
    """A request dispatched to an idle engine with 260 prompt tokens, on an engine whose decode
    step is 66 ms, had its first token after 76 ms: 10 ms for 260 tokens beyond the step, 38.5
    us a token; in full steps of 2,048 tokens, each also costing the 66 ms, 14,150 tokens a
    second (the H200's full step: 2,048 tokens in about 150 ms), where the wait alone says
    3,421. 3,000 tokens take two steps; a wait within the steps' cost, one before the decode
    step is known, or one that does not learn (warmup's first pass) teaches nothing. A wait is
    measured once its step's outputs are all in (the next token after them)."""
    cost = PrefillCost(weight=1.0)
    assert cost.rate(0.066, 2048) is None

    def timed(key: int, wait_s: float, tokens: int, *, step_s: float | None = 0.066,
              learn: bool = True) -> None:
        cost.dispatched(key, 10.0 * key, stepping=False)
        cost.first_token(key, 10.0 * key + wait_s, prompt_tokens=tokens, step_s=step_s,
                         step_tokens=2048, learn=learn)
        assert cost.token_s == before  # its step's other outputs may still come
        cost.token(10.0 * key + wait_s + 1.0, previous_at=None, step_s=0.066)

    before = None
    timed(1, 0.076, 260, step_s=None)
    timed(2, 0.060, 260)
    timed(3, 0.076, 260, learn=False)
    assert cost.token_s is None
    timed(4, 0.076, 260)
    assert cost.token_s == pytest.approx(0.010 / 260)
    assert cost.rate(0.066, 2048) == pytest.approx(1 / (0.010 / 260 + 0.066 / 2048))
    assert 14_100 < cost.rate(0.066, 2048) < 14_200  # type: ignore[operator]
    assert cost.rate(0.066, 0) is None
    before = cost.token_s
    timed(5, 2 * 0.066 + 0.120, 3000)
    assert cost.token_s == pytest.approx(0.120 / 3000)


def test_a_request_dispatched_during_a_step_is_timed_from_that_steps_end() -> None:
    """Streams decode in 66 ms steps. A 260-token prompt dispatched 50 ms into a step waits out
    the 16 ms left of it, then its own 76 ms step: its wait is timed from the next step's
    outputs (38.5 us a token; from its dispatch, 100 us). One dispatched while a step's outputs
    are still arriving (the next step already runs) starts after the step after. One
    dispatched during a step that runs long, prefilling a 1,000-token prompt ahead of it for
    0.5 s, is timed from that step's end over its own 260 tokens (the code before timed it from
    a decode step after its dispatch, over all 1,260 ahead of it then: 273 us a token). One
    whose own first token is the next output is timed from its dispatch; one that ends without
    a first token is forgotten. Two prompts that one step prefilled together each count both:
    38.5 us a token, where the prompts ahead of each at its dispatch said 38.5 and 77."""
    step = 0.066
    cost = PrefillCost(weight=1.0)

    def outputs(at: float, streams: range = range(3)) -> None:  # a step's, 0.2 ms apart
        for stream in streams:
            now = at + 0.0002 * stream
            cost.token(now, previous_at=now - 0.0002 if stream else at - step, step_s=step)

    def first(key: int, at: float, prompt: int = 260) -> None:
        cost.first_token(key, at, prompt_tokens=prompt, step_s=step, step_tokens=2048)

    outputs(0.0)
    cost.dispatched(1, 0.050, stepping=True)
    outputs(step)
    first(1, step + 0.076)
    outputs(2 * step + 0.076)
    assert cost.token_s == pytest.approx(0.010 / 260)

    outputs(0.3, range(1))
    cost.dispatched(2, 0.3001, stepping=True)  # among that step's outputs
    outputs(0.3, range(1, 3))
    outputs(0.3 + step)
    first(2, 0.3 + step + 0.076 + 0.000_26)
    outputs(0.6)
    assert cost.token_s == pytest.approx(0.010_26 / 260)

    cost.dispatched(30, 0.98, stepping=True)
    outputs(1.0)  # the step after: it prefills request 30's 1,000 tokens for 0.5 s
    cost.dispatched(3, 1.1, stepping=True)  # 1,260 tokens ahead, its own included
    first(30, 1.5, 1000)
    outputs(1.5)
    first(3, 1.5 + 0.076 + 0.000_52)
    outputs(1.7)
    assert cost.token_s == pytest.approx(0.010_52 / 260)

    cost.dispatched(4, 2.0, stepping=True)
    first(4, 2.0 + 0.076 + 0.000_78)
    outputs(2.2)
    assert cost.token_s == pytest.approx(0.010_78 / 260)

    cost.dispatched(5, 3.0, stepping=True)
    cost.forget(5)
    first(5, 3.5)
    outputs(3.7)
    assert cost.token_s == pytest.approx(0.010_78 / 260)

    cost.dispatched(6, 4.0, stepping=False)
    cost.dispatched(7, 4.0, stepping=False)
    first(6, 4.0 + step + 0.020)
    first(7, 4.0 + step + 0.020)
    outputs(4.3)
    assert cost.token_s == pytest.approx(0.020 / 520)


def test_a_sequence_bound_engine_learns_its_full_step_and_starts_a_burst_of_64() -> None:
    """An H200-shaped engine (64 sequences, 2,048-token steps, a 66 ms decode step) whose
    requests arrived one at a time, each prefilled in a step of its own in 76 ms: the windows
    measure about 3,300 prompt tokens a second (a step's latency per prompt) and the replay
    then put the 21st of a burst past the late bound. The prefill cost per token beyond the
    step (38 us) puts all 64 within it, as vLLM's server started them on an H200; the 65th
    waits for a sequence and is refused."""
    clock = FakeClock()

    async def scenario() -> tuple[float, list[bool]]:
        admission = burst_controller(clock, blocks=64 * 20, prefill_rate=3_300.0,
                                     step_tokens=2048)
        admission.decode.reset()
        admission.decode.answer(63 * 0.066, 64)
        for _ in range(8):  # one at a time: dispatched, its first token 76 ms later, done
            reservation = await admission.acquire(SHORT, max_wait_s=1.0)
            clock.now += 0.076
            admission.progress(reservation, 1)
            admission.release(reservation)
            clock.now += 1.0
        admission.valve.target_s = 0.5  # where a slot-bound surge leaves it
        windows = admission.prefill.rate
        return windows, await offer(admission, 80)

    windows, outcomes = asyncio.run(scenario())
    assert windows < 3_400
    assert outcomes == [True] * 64 + [False] * 16, outcomes.count(True)


def test_the_replay_predicts_with_the_second_slowest_of_the_last_eight_measures() -> None:
    """The H200-shaped engine of the test above, each request prefilled alone in a step of its
    own, but some steps ran slow: 96 ms where the others took 76 (120 us a token beyond the
    decode step, not 40). The estimates' recent level has almost forgotten them (about 50 us
    a token, 12,000 tokens a second in full steps: all 64 of a burst within the late bound),
    but a burst's prompts are prefilled in a few long steps whose speed varies as these did,
    and all of one step's first tokens come late together. The replay predicts with the
    second slowest of the last :data:`~gateway.admission.valve.LOW_SAMPLES` measures
    (:data:`~gateway.admission.valve.LOW_RANK`): after one slow step among eight all 64 are
    admitted (the slowest, 6,600 tokens a second, admitted 42: on vLLM's CPU build its whole
    burst protocol served 106 within the SLO where the second slowest served 116, none late
    with either; issue 37, twenty-first round); after two, 42 are. Eight ordinary measures
    after the first slow one it is forgotten, and all 64 are again. With the recent level,
    bursts on vLLM's CPU build, whose step that prefills a burst's next six to eight prompts
    ran at 1,010 to 1,745 tokens a second within one run, started a whole batch after the SLO
    in 7 of 46 rounds (twentieth round)."""
    clock = FakeClock()

    async def scenario(slow: int, ordinary: int) -> tuple[float | None, int]:
        """``slow`` slow steps, then ``ordinary`` ones, then a burst of 80: the level, and how
        many of the burst were admitted."""
        admission = burst_controller(clock, blocks=64 * 20, prefill_rate=3_300.0,
                                     step_tokens=2048)
        admission.decode.reset()
        admission.decode.answer(63 * 0.066, 64)
        for own_step_s in [0.096] * slow + [0.076] * ordinary:
            reservation = await admission.acquire(SHORT, max_wait_s=1.0)
            clock.now += own_step_s
            admission.progress(reservation, 1)
            admission.release(reservation)
            clock.now += 1.0
        admission.valve.target_s = 0.5  # where a slot-bound surge leaves it
        return admission.prefill_cost.token_s, (await offer(admission, 80)).count(True)

    level, after_one = asyncio.run(scenario(1, 7))
    assert level is not None and 45e-6 < level < 55e-6  # the level: 64 would be admitted
    assert after_one == 64
    assert asyncio.run(scenario(2, 6))[1] == 42
    assert asyncio.run(scenario(2, 7))[1] == 42  # seven measured after the first slow one
    assert asyncio.run(scenario(2, 8))[1] == 64  # eight: the ninth is at the next token


def test_the_late_bound_never_lowers_a_target_above_it() -> None:
    """The ran-dry rule can raise the target to 0.9 of the SLO, above the late bound: a first
    wave dispatched at once is then held to the target, as any other request. At 9,200 prompt
    tokens a second the 64th first token comes at 1.74 s: within a 1.8 s target, after the
    1.6 s late bound (which would have refused the last six)."""
    async def scenario() -> list[bool]:
        admission = burst_controller(FakeClock(), blocks=64 * 20, prefill_rate=9_200.0)
        admission.valve.target_s = 1.8
        return await offer(admission, 64)

    assert asyncio.run(scenario()).count(True) == 64


def test_before_the_decode_step_is_known_the_valve_decides_alone() -> None:
    """No answer has ended yet (a new engine before warmup): the replay has no step to predict
    with, and the valve's cap is the decision."""
    async def scenario() -> int:
        admission = burst_controller(FakeClock())
        admission.decode.reset()
        return (await offer(admission, 20)).count(False)

    assert asyncio.run(scenario()) == 15


def test_a_screened_request_is_not_decided_again_unless_it_is_bigger() -> None:
    """The screen let two through at an estimate of 250 tokens; by the time they are sized the
    backlog is over the cap. One of 450 tokens (within twice the estimate) keeps the screen's
    decision; one of 600 is decided again on its own prompt, and refused."""
    async def scenario() -> tuple[bool, bool]:
        clock = FakeClock()
        admission = AdmissionController(ledger(blocks=1000), ttft_slo_s=2.0, max_running=64,
                                        clock=clock, prior_rate=1000.0)
        held = await admission.acquire(AdmissionRequest(bucket=SHORT.bucket, prompt_tokens=1300,
                                                        max_tokens=64), max_wait_s=1.0)
        usual = AdmissionRequest(bucket=SHORT.bucket, prompt_tokens=450, max_tokens=64)
        same = await admission.acquire(usual, max_wait_s=1.0, screened_tokens=250.0)
        bigger = AdmissionRequest(bucket=SHORT.bucket, prompt_tokens=600, max_tokens=64)
        try:
            await admission.acquire(bigger, max_wait_s=1.0, screened_tokens=250.0)
            refused = False
        except AdmissionRejected:
            refused = True
        admission.release(held)
        admission.release(same)
        return same is not None, refused

    assert asyncio.run(scenario()) == (True, True)


def test_requests_dispatched_mid_step_teach_the_same_cost_and_a_burst_of_64_starts() -> None:
    """The same engine with a stream decoding beside: each of eight requests is dispatched 50 ms
    into a 66 ms step, waits 16 ms for that step's end and then 76 ms for its own. Timed from
    the step's end its cost is 38 us a token, and all 64 of the burst after start within the
    late bound; timed from its dispatch it was 104 us (7,300 tokens a second in full steps),
    and 46 of the burst were admitted (on the simulator shaped like the H200, 49 of the 64
    vLLM's server starts)."""
    clock = FakeClock()

    async def scenario() -> tuple[float | None, list[bool]]:
        admission = burst_controller(clock, blocks=64 * 20, prefill_rate=3_300.0,
                                     step_tokens=2048)
        admission.decode.reset()
        admission.decode.answer(63 * 0.066, 64)
        beside = await admission.acquire(SHORT, max_wait_s=1.0)
        admission.progress(beside, 1)  # decoding: the engine runs a step every 66 ms
        for _ in range(8):
            clock.now += 0.050
            reservation = await admission.acquire(SHORT, max_wait_s=1.0)
            clock.now += 0.016
            admission.progress(beside, 1)  # the step in progress ends
            clock.now += 0.076  # the request's own step, its prompt beside the stream
            admission.progress(reservation, 1)
            admission.progress(beside, 1)
            admission.release(reservation)
        admission.release(beside)
        admission.valve.target_s = 0.5  # where a slot-bound surge leaves it
        return admission.prefill_cost.token_s, await offer(admission, 80)

    token_s, outcomes = asyncio.run(scenario())
    assert token_s == pytest.approx(0.010 / 250, rel=0.01)
    assert outcomes == [True] * 64 + [False] * 16, outcomes.count(True)


def test_before_any_answer_ends_the_running_answers_pace_says_a_sequence_is_seconds_away(
) -> None:
    """A surge's first seconds on an H200-shaped engine: 64 sequences, all taken by answers of
    64 tokens that started together and have 12 tokens each at 66 ms a token, and no answer has
    ended (the decode step is not known). The 65th request waits for a sequence about 3.4 s:
    the answers' pace so far says so, and it is refused although nothing waits for a first
    token (the valve's floor) — as is the next, and one the arrival screen decides before it
    is parsed. Before, the floor admitted it and the valve's cap the ones after it, and 13 of
    the simulator's surge started late. With one sequence free the floor admits at once."""
    clock = FakeClock()

    async def scenario() -> tuple[list[bool], list[bool]]:
        admission = AdmissionController(
            AdmissionLedger(KvCapacity(64 * 20, 16), watermark=0.9,
                            bucket_caps=dict.fromkeys(("S", "M", "L", "XL"), 64)),
            ttft_slo_s=2.0, max_running=64, clock=clock, step_tokens=2048)
        admission.prefill.reset(RATE)
        for _ in range(30):
            admission.lengths.observe(64, capped=False)
        admission.valve.reset(100_000.0)  # its cap takes all 64 at once
        running = [await admission.acquire(SHORT, max_wait_s=1.0) for _ in range(64)]
        clock.now += 0.1
        for reservation in running:
            admission.progress(reservation, 1)
        for _ in range(12):
            clock.now += 0.066
            for reservation in running:
                admission.progress(reservation, 1)
        assert admission.decode.step_s is None and admission.valve.waiting == 0
        full = await offer(admission, 2)
        screened = admission.screen(200)  # the same, decided before it is parsed
        admission.release(running[0])
        return [*full, isinstance(screened, ScreenPass)], await offer(admission, 1)

    full, freed = asyncio.run(scenario())
    assert full == [False, False, False]
    assert freed == [True]


def test_a_bucket_at_its_cap_frees_a_slot_when_one_of_its_answers_ends() -> None:
    """A bucket capped at two, its two running answers ending at 1.0 and 2.0 s: the first of
    three waiting takes a slot at 1.0 s and holds it for its prefill and answer (0.1 + 0.1 s),
    the second takes that slot again when it ends, at 1.2 s, and the third when the second
    ends, at 1.4 s (before the other running answer at 2.0 s); a bucket with a free slot is
    free at once."""
    def waiting(count: int) -> list[Candidate]:
        return [Candidate(blocks=1, end_blocks=1, sequences=1, prompt_tokens=1000, output=11)
                for _ in range(count)]

    def slot(count: int, cap: int = 2) -> float:
        return slot_free_at(0.0, running_ends=[2.0, 1.0], queued=waiting(count), cap=cap,
                            step_s=0.01, prefill_rate=RATE)

    assert slot(1) == pytest.approx(1.0)
    assert slot(2) == pytest.approx(1.2)
    assert slot(3) == pytest.approx(1.4)
    assert slot(1, cap=3) == 0.0
    with pytest.raises(ValueError, match="cap"):
        slot(1, cap=0)


def test_a_request_whose_bucket_is_at_its_cap_waits_for_a_slot_not_for_the_pool() -> None:
    """XL capped at two on a pool with room for many more: two 3,000-token XL requests run
    (prefilled by 0.3 and 0.6 s, answers of 64 tokens at 15 ms). A third XL waits for the first
    one's slot, 1.245 s, and its own prefill: 1.545 s, past the 1.4 s target — refused, sized
    or screened (the screen counts an unsized request in the bucket of the usual request). A
    short request beside them starts at once. The replay saw room in the pool and sequences
    free and admitted the third, the screen's too: in a burst of 64 long requests on the CPU
    build (XL capped at eight) the ninth and tenth admitted waited 2.3 and 5.2 s for a slot."""
    clock = FakeClock()
    caps = {"S": 64, "M": 64, "L": 64, "XL": 2}
    xl = AdmissionRequest(bucket=LengthBucket.XL, prompt_tokens=3000, max_tokens=64)

    async def scenario() -> tuple[bool, bool, bool]:
        admission = AdmissionController(
            AdmissionLedger(KvCapacity(10_000, 16), watermark=0.9, bucket_caps=caps,
                            bounds=bucket_bounds(4096)),
            ttft_slo_s=2.0, max_running=64, clock=clock)
        admission.prefill.reset(RATE)
        admission.decode.answer(63 * 0.015, 64)
        for _ in range(30):
            admission.lengths.observe(64, capped=False)
        admission.valve.reset(100_000.0)  # its cap takes every one of them
        for _ in range(2):
            await admission.acquire(xl, max_wait_s=1.0)
        third = await offer_one(admission, xl)
        short = await offer_one(admission, SHORT)
        screened = admission.screen(200)
        return third, short, isinstance(screened, ScreenPass)

    third, short, screened = asyncio.run(scenario())
    assert (third, short, screened) == (False, True, False)


async def offer_one(admission: AdmissionController, asked: AdmissionRequest) -> bool:
    """Whether ``asked`` is admitted (dispatched or queued) rather than refused on arrival."""
    task = asyncio.ensure_future(admission.acquire(asked, max_wait_s=5.0))
    await asyncio.sleep(0)
    return not (task.done() and isinstance(task.exception(), AdmissionRejected))
