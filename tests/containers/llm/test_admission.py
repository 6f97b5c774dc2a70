"""KV-aware admission: block rounding, buckets, watermark, caps (the ledger); refusals on arrival
by the prefill valve, first-come-first-served dispatch, and what the streams teach it (the
controller). The valve's own rules: test_valve.py; its healing on the real clock:
test_admission_healing.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.admission import (
    AdmissionController,
    AdmissionLedger,
    AdmissionRejected,
    AdmissionRequest,
    KvReservation,
    LengthBucket,
    RefusalReason,
    ScreenPass,
    classify_bucket,
    retry_after_header,
)
from gateway.admission.controller import REFUSAL_HOLD_S
from gateway.admission.valve import TARGET_SHARE
from gateway.api.chat_run import FinishEvent, TextEvent
from gateway.api.errors import ApiError
from gateway.engines.base import KvCapacity
from request_buckets import bucket_bounds
from tests.containers.llm.harness import chat_request, new_record

BOUNDS = bucket_bounds(4096)  # S ≤ 512, M ≤ 1,024, L ≤ 2,048
CAPS = {"S": 4, "M": 3, "L": 2, "XL": 1}


def ledger(blocks: int = 100, watermark: float = 0.9) -> AdmissionLedger:
    return AdmissionLedger(KvCapacity(blocks, 16), watermark=watermark, bucket_caps=CAPS)


@pytest.mark.parametrize(("tokens", "bucket"), [(1, "S"), (512, "S"), (513, "M"), (1024, "M"),
                                                (2048, "L"), (2049, "XL"), (10**6, "XL")])
def test_buckets_by_reserved_tokens(tokens: int, bucket: str) -> None:
    assert classify_bucket(tokens, BOUNDS) is LengthBucket(bucket)


def test_what_the_running_requests_hold_now_limits_dispatch_in_the_whole_pool() -> None:
    """vLLM's own rule: a prompt is dispatched when it fits beside what the running requests
    hold now, in the whole pool; the watermark bounds one request's expected end-state."""
    book = ledger(blocks=100, watermark=0.9)
    assert book.limit_blocks == 90 and book.pool_blocks == 100
    first = book.reserve(LengthBucket.L, 60 * 16)
    assert book.refusal(LengthBucket.L, 41 * 16) is RefusalReason.KV_POOL
    assert book.refusal(LengthBucket.L, 40 * 16) is None
    book.grow(5)  # its answer grew into five more blocks
    assert book.refusal(LengthBucket.L, 36 * 16) is RefusalReason.KV_POOL
    assert book.refusal(LengthBucket.L, 35 * 16) is None
    book.release(first, grown_blocks=5)
    assert book.reserved_blocks == 0
    assert book.total_inflight == 0


def test_bucket_caps_are_per_bucket() -> None:
    book = ledger(blocks=10_000)
    for _ in range(CAPS["XL"]):
        book.reserve(LengthBucket.XL, 3000)
    assert book.refusal(LengthBucket.XL, 3000) is RefusalReason.BUCKET_CAP
    assert book.refusal(LengthBucket.S, 100) is None  # XL traffic cannot starve short requests


def test_probe_limit_and_never_fits() -> None:
    book = ledger(blocks=100)
    book.reserve(LengthBucket.S, 100)
    assert book.refusal(LengthBucket.S, 100, max_total_inflight=1) is RefusalReason.PROBE_LIMIT
    assert book.refusal(LengthBucket.XL, 91 * 16) is RefusalReason.NEVER_FITS
    with pytest.raises(ValueError, match="never_fits"):
        book.reserve(LengthBucket.XL, 91 * 16)


def test_capacity_comes_from_the_engine_and_can_change() -> None:
    book = ledger(blocks=1)
    book.set_capacity(KvCapacity(2048, 16))
    assert book.limit_blocks == 1843
    assert book.blocks_for(4096) == 256


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def controller(blocks: int = 100, *, slo_s: float = 2.0, watermark: float = 0.9,
               max_running: int = 64, rate: float = 1000.0,
               clock: Any = time.monotonic) -> AdmissionController:
    """A controller whose valve believes the engine drains ``rate`` prompt tokens a second
    (target: half the SLO)."""
    return AdmissionController(ledger(blocks=blocks, watermark=watermark), ttft_slo_s=slo_s,
                               max_running=max_running, clock=clock, prior_rate=rate)


def request(tokens: int, max_tokens: int = 100, bucket: LengthBucket = LengthBucket.L
            ) -> AdmissionRequest:
    return AdmissionRequest(bucket=bucket, prompt_tokens=tokens - max_tokens,
                            max_tokens=max_tokens)


def test_a_request_that_fits_is_dispatched_at_once() -> None:
    async def scenario() -> tuple[KvReservation, int]:
        admission = controller()
        reservation = await admission.acquire(request(1000), max_wait_s=1.0)
        return reservation, admission.valve.backlog

    reservation, backlog = asyncio.run(scenario())
    assert reservation.blocks == 57  # its 900 prompt tokens and its first token, blocks of 16
    assert backlog == 900  # waiting for its first token
    assert not reservation.floor


def test_a_request_beyond_the_valve_is_refused_at_once_with_a_retry_after() -> None:
    """Target 1.4 s (0.7 of a 2 s SLO) at 1,000 tokens a second: 900 tokens wait, 900 more
    would not drain in time; refused on arrival (not after a wait), the Retry-After the
    backlog's drain time."""
    async def scenario() -> tuple[AdmissionRejected, float, int]:
        admission = controller(slo_s=2.0, rate=1000.0)
        held = await admission.acquire(request(1000), max_wait_s=1.0)
        started = time.perf_counter()
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire(request(1000), max_wait_s=5.0)
        elapsed = time.perf_counter() - started
        admission.release(held)
        return caught.value, elapsed, admission.waiting

    rejected, elapsed, waiting = asyncio.run(scenario())
    assert rejected.reason is RefusalReason.TTFT_SLO and rejected.bucket is LengthBucket.L
    assert elapsed < 0.05 and rejected.waited_s == 0.0
    target_s = TARGET_SHARE * 2.0
    assert (rejected.backlog_tokens, rejected.cap_tokens) == (900, pytest.approx(1000 * target_s))
    assert rejected.retry_after_s == pytest.approx(1800 / 1000 - target_s)
    assert retry_after_header(rejected.retry_after_s, 1) == "1"
    assert retry_after_header(120.0, 1) == "60" and retry_after_header(None, 2) == "2"
    assert waiting == 0


def test_a_first_token_frees_the_backlog_for_the_next_request() -> None:
    async def scenario() -> KvReservation:
        admission = controller(blocks=1000, slo_s=2.0, rate=1000.0)
        held = await admission.acquire(request(1000), max_wait_s=1.0)
        admission.progress(held, 1)
        return await admission.acquire(request(1000), max_wait_s=1.0)

    assert asyncio.run(scenario()).tokens == 901


def test_queued_requests_are_dispatched_first_come_first_served() -> None:
    async def scenario() -> list[int]:
        admission = controller(slo_s=10.0, rate=1e6)
        held = await admission.acquire(request(1300), max_wait_s=1.0)
        order: list[int] = []

        async def queued(index: int) -> None:
            reservation = await admission.acquire(request(1300), max_wait_s=5.0)
            order.append(index)
            await asyncio.sleep(0.005)
            admission.release(reservation)

        tasks = [asyncio.create_task(queued(i)) for i in range(4)]
        await asyncio.sleep(0.01)
        assert admission.waiting == 4
        admission.release(held)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == [0, 1, 2, 3]


def test_a_request_queued_past_the_safety_net_is_shed_and_leaves_the_backlog() -> None:
    async def scenario() -> tuple[AdmissionRejected, int]:
        admission = controller(slo_s=10.0, rate=1e6)
        await admission.acquire(request(1300), max_wait_s=1.0)
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire(request(1300), max_wait_s=0.05)
        assert admission.waiting == 0
        return caught.value, admission.valve.backlog

    rejected, backlog = asyncio.run(scenario())
    assert rejected.reason is RefusalReason.QUEUE_TIMEOUT
    assert rejected.waited_s >= 0.04
    assert backlog == 1200  # the first one only


def test_half_open_probes_and_never_fitting_requests_are_refused_at_once() -> None:
    async def scenario() -> list[RefusalReason]:
        admission = controller()
        await admission.acquire(request(100, 10), max_wait_s=1.0)
        reasons = []
        for tokens, limit in ((100, 1), (91 * 16, None)):
            with pytest.raises(AdmissionRejected) as caught:
                await admission.acquire(request(tokens, 10), max_wait_s=1.0,
                                        max_total_inflight=lambda limit=limit: limit)
            reasons.append(caught.value.reason)
        return reasons

    assert asyncio.run(scenario()) == [RefusalReason.PROBE_LIMIT, RefusalReason.NEVER_FITS]


def test_the_streams_teach_the_drain_rate_and_the_answer_lengths() -> None:
    """Four requests of 100 prompt tokens admitted at once have their first tokens 0.1 s
    apart: a window closes at 0.3 s of backlog (300 tokens, 1,000 a second; the prior was
    5,000) and the last 0.1 s, the rest of that stretch, is dropped."""
    clock = FakeClock()

    async def scenario() -> AdmissionController:
        admission = controller(blocks=1000, rate=5000.0, clock=clock)
        reservations = [await admission.acquire(request(200, 100, LengthBucket.S),
                                                max_wait_s=1.0) for _ in range(4)]
        for reservation in reservations:
            clock.now += 0.1
            admission.progress(reservation, 1)
        for reservation in reservations:
            admission.release(reservation, completion_tokens=40, capped=False)
        return admission

    admission = asyncio.run(scenario())
    assert admission.valve.windows == 1
    assert 1000.0 < admission.valve.rate < 5000.0
    assert admission.lengths.typical() is None  # 4 answers are not enough to trust
    assert admission.ledger.reserved_blocks == 0 and admission.valve.backlog == 0


def test_a_caller_that_goes_away_while_queued_leaves_nothing_behind() -> None:
    async def scenario() -> AdmissionController:
        admission = controller(slo_s=10.0, rate=1e6)
        held = await admission.acquire(request(1300), max_wait_s=1.0)
        task = asyncio.create_task(admission.acquire(request(1300), max_wait_s=5.0))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        admission.release(held)
        return admission

    admission = asyncio.run(scenario())
    assert admission.waiting == 0 and admission.valve.backlog == 0
    assert admission.ledger.reserved_blocks == 0 and admission.ledger.total_inflight == 0


def test_many_requests_are_served_or_refused_without_leaks() -> None:
    async def scenario() -> tuple[AdmissionController, dict[str, int]]:
        admission = controller(blocks=64, watermark=1.0, slo_s=0.5, rate=2000.0)
        outcomes = {"served": 0, "refused": 0}

        async def one(tokens: int) -> None:
            bucket = LengthBucket.S if tokens <= 512 else LengthBucket.M
            try:
                reservation = await admission.acquire(request(tokens, 50, bucket),
                                                      max_wait_s=5.0)
            except AdmissionRejected:
                outcomes["refused"] += 1
                return
            await asyncio.sleep(0.001)
            admission.progress(reservation, 1)
            admission.release(reservation)
            outcomes["served"] += 1

        await asyncio.gather(*(one(100 + (i * 37) % 900) for i in range(200)))
        return admission, outcomes

    admission, outcomes = asyncio.run(scenario())
    assert outcomes["served"] + outcomes["refused"] == 200
    assert outcomes["served"] > 0 and outcomes["refused"] > 0
    assert admission.ledger.reserved_blocks == 0 and admission.valve.backlog == 0
    assert admission.ledger.total_inflight == 0
    assert admission.waiting == 0


def choices_request(tokens: int, max_tokens: int = 100, sequences: int = 3,
                    bucket: LengthBucket = LengthBucket.S) -> AdmissionRequest:
    return AdmissionRequest(bucket=bucket, prompt_tokens=tokens - max_tokens,
                            max_tokens=max_tokens, sequences=sequences)


def test_a_request_of_three_choices_runs_three_of_max_running() -> None:
    """max_running is the engine's max_num_seqs: n=3 takes three sequences, so with four slots
    a second n=3 request waits while a single-choice one fits; the KV holds its prompt once and
    one token per choice."""
    async def scenario() -> tuple[KvReservation, int, int, RefusalReason | None]:
        admission = controller(blocks=1000, slo_s=10.0, max_running=4, rate=1e6)
        held = await admission.acquire(choices_request(300), max_wait_s=1.0)
        running = admission.running_sequences
        single = await admission.acquire(request(200, 100, LengthBucket.S), max_wait_s=1.0)
        reason = None
        try:
            await admission.acquire(choices_request(200), max_wait_s=0.02)
        except AdmissionRejected as rejected:
            reason = rejected.reason
        full = admission.running_sequences
        admission.release(single)
        admission.release(held)
        return held, running, full, reason

    held, running, full, reason = asyncio.run(scenario())
    assert held.tokens == 200 + 3
    assert running == 3 and full == 4
    assert reason is RefusalReason.QUEUE_TIMEOUT  # admitted, but waited for its three slots


def test_more_choices_than_max_running_never_fit() -> None:
    async def scenario() -> RefusalReason:
        admission = controller(blocks=1000, max_running=2)
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire(choices_request(200), max_wait_s=1.0)
        return caught.value.reason

    assert asyncio.run(scenario()) is RefusalReason.NEVER_FITS


def test_the_learned_answer_length_is_per_choice() -> None:
    """An n=3 request whose usage counts 120 completion tokens taught 3 answers of 40."""
    async def scenario() -> AdmissionController:
        admission = controller(blocks=1000)
        for _ in range(7):
            reservation = await admission.acquire(choices_request(300), max_wait_s=1.0)
            admission.progress(reservation, 120)
            admission.release(reservation, completion_tokens=120, capped=False)
        return admission

    admission = asyncio.run(scenario())
    assert admission.lengths.typical() == 40  # 21 answers of 40, not 7 of 120
    assert admission.lengths.expected(100) == 40
    assert admission.running_sequences == 0 and admission.ledger.reserved_blocks == 0


def test_the_gateway_runs_and_learns_n_choices_per_choice(make_runtime: Any) -> None:
    """Through the service on the simulated engine: an n=3 request holds three of the running
    sequences while it streams, and admission learns three answers of 12 tokens (its usage
    counts 36), each choice's stream pacing itself."""
    runtime, _ = make_runtime(SIM_EOS_PROBABILITY="0")

    async def scenario() -> tuple[list[int], int, list[int]]:
        await runtime.supervisor.start()
        running: list[int] = []
        learned_before = len(runtime.admission.lengths._recent)
        request = chat_request(messages=[{"role": "user", "content": "Naruto?"}],
                               max_tokens=12, n=3)
        record = new_record()
        prepared = runtime.service.prepare(request, record)
        admission = await runtime.service.admit(prepared)
        choices: list[int] = []
        async for event in runtime.service.run(prepared, admission):
            running.append(runtime.admission.running_sequences)
            if isinstance(event, TextEvent):
                choices.append(event.choice)
            else:
                assert isinstance(event, FinishEvent)
        await runtime.supervisor.close()
        assert record.completion_tokens == 36
        learned = [tokens for tokens, _ in list(runtime.admission.lengths._recent)[learned_before:]]
        return running, runtime.admission.running_sequences, [*learned, len(set(choices))]

    running, after, learned = asyncio.run(scenario())
    assert set(running[:-1]) == {3} and after == 0
    assert learned == [12, 12, 12, 3]


def test_more_choices_than_the_engine_runs_at_once_are_a_400_naming_n(make_runtime: Any) -> None:
    runtime, _ = make_runtime(ENGINE_MAX_NUM_SEQS="2")
    with pytest.raises(ApiError) as caught:
        runtime.service.prepare(chat_request(messages=[{"role": "user", "content": "Naruto?"}],
                                             max_tokens=12, n=3), new_record())
    assert caught.value.status == 400 and caught.value.param == "n"
    assert "at most 2 are accepted" in caught.value.message


def test_warmup_is_never_refused_by_the_valve_but_counts_in_its_backlog() -> None:
    """Warmup measures the rate the valve decides by; refused by it (a loaded machine, a long
    warmup prompt) it could never complete and /ping would never turn healthy."""
    async def scenario() -> tuple[AdmissionRejected, KvReservation, int]:
        admission = controller(blocks=1000, slo_s=2.0, rate=1000.0)
        held = await admission.acquire(request(1000), max_wait_s=1.0)
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire(request(1000), max_wait_s=5.0)
        warmup = await admission.acquire(request(1000), max_wait_s=5.0, by_valve=False)
        backlog = admission.valve.backlog
        admission.release(held)
        return caught.value, warmup, backlog

    rejected, warmup, backlog = asyncio.run(scenario())
    assert rejected.reason is RefusalReason.TTFT_SLO
    assert warmup.blocks > 0 and backlog == 1800


def test_the_floor_admits_a_request_alone_whatever_the_rate_and_flags_refusals_while_idle(
) -> None:
    """A valve that learned 10 tokens a second (a one-off compile) still admits a request when
    nothing waits (counted as a floor admit); the next one, while the first waits, is refused,
    and since the engine is nearly idle that refusal is flagged (docs/design-decisions.md
    #admission-lock-out)."""
    async def scenario() -> tuple[KvReservation, AdmissionRejected, AdmissionController]:
        admission = controller(blocks=1000, rate=10.0)
        held = await admission.acquire(request(300, bucket=LengthBucket.S), max_wait_s=1.0)
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire(request(300, bucket=LengthBucket.S), max_wait_s=1.0)
        admission.release(held)
        return held, caught.value, admission

    held, rejected, admission = asyncio.run(scenario())
    assert held.floor
    assert rejected.reason is RefusalReason.TTFT_SLO and rejected.while_idle
    arrivals = admission.arrivals
    assert (arrivals.floor_admits, arrivals.refused_by_valve, arrivals.refused_while_idle) == (
        1, 1, 1)
    assert admission.idle_first_token_s(200) == pytest.approx(20.0)


def test_a_refusal_under_load_is_not_flagged_as_idle() -> None:
    async def scenario() -> AdmissionRejected:
        admission = controller(blocks=1000, rate=10.0)
        admission.max_running = 8  # nearly idle: at most one running
        held = [await admission.acquire(request(300, bucket=LengthBucket.S), max_wait_s=1.0,
                                        by_valve=False) for _ in range(2)]
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire(request(300, bucket=LengthBucket.S), max_wait_s=1.0)
        for reservation in held:
            admission.release(reservation)
        return caught.value

    assert not asyncio.run(scenario()).while_idle


def test_a_batch_the_engine_takes_in_one_step_is_admitted_whatever_the_rate_learned() -> None:
    """A GPU engine prefills a lone 150-token prompt in a ~150 ms step, so a valve that only
    ever saw lone requests learns ~1,000 tokens a second, while 2,048 tokens take about the same
    step (the H100 run in docs/gateway.md#surges: 12,898 refused of a closed loop of 64). A
    backlog that fits one scheduler step and that the engine takes at once is admitted however
    low the rate: 13 of 20 simultaneous 150-token prompts with a 2,048-token step (the old rule:
    1, the floor); beyond the step, the rate decides again."""
    async def scenario(step_tokens: int) -> int:
        book = AdmissionLedger(KvCapacity(10_000, 16), watermark=0.9,
                               bucket_caps={"S": 64, "M": 64, "L": 64, "XL": 64})
        admission = AdmissionController(book, ttft_slo_s=2.0, max_running=64,
                                        prior_rate=100.0, step_tokens=step_tokens)
        admitted = 0
        for _ in range(20):
            try:
                await admission.acquire(request(250, bucket=LengthBucket.S), max_wait_s=1.0)
                admitted += 1
            except AdmissionRejected:
                pass
        return admitted

    assert asyncio.run(scenario(0)) == 1  # the floor, then the cap of 100 tokens
    assert asyncio.run(scenario(2048)) == 13  # 13 × 150 ≤ 2,048 < 14 × 150


def test_the_step_rule_holds_only_for_prompts_the_engine_takes_at_once() -> None:
    """When the pool is full, a prompt waits for KV room and is not prefilled in the next
    step: the step rule does not admit it (the rate does, or refuses)."""
    async def scenario() -> tuple[bool, bool]:
        admission = AdmissionController(ledger(blocks=30), ttft_slo_s=2.0, max_running=64,
                                        prior_rate=100.0, step_tokens=2048)
        held = await admission.acquire(request(400, max_tokens=10, bucket=LengthBucket.S),
                                       max_wait_s=1.0)  # 25 of 30 blocks: 10 more do not fit
        try:
            await admission.acquire(request(250, bucket=LengthBucket.S), max_wait_s=0.01)
            full = True
        except AdmissionRejected:
            full = False
        admission.release(held)
        return full, admission.valve.fits_step(150, admission.clock())

    admitted_into_a_full_pool, fits = asyncio.run(scenario())
    assert not admitted_into_a_full_pool
    assert fits  # the valve's own rule would have: the engine could not take it


def test_the_floor_counts_the_running_answers_at_their_ends() -> None:
    """With nothing waiting for a first token, the floor admits a request the engine takes at
    once without asking the turnover. A prompt that fits beside what the running answers hold
    now, but not beside what they will hold at their ends, is not such a request: vLLM starts
    it, and when the answers grow into its blocks it preempts it (the request it admitted last)
    until they end. Four answers at 0.1 s a token, each to end at 25 of a pool's 100 blocks
    (20 each now): a fifth 300-token prompt (19 blocks) waits about 8.9 s for room. The code
    before admitted it by the floor, in the screen and on its own prompt alike."""
    clock = FakeClock()

    async def scenario() -> tuple[object, AdmissionRejected | None]:
        admission = controller(blocks=100, slo_s=2.0, rate=1000.0, clock=clock)
        held = [await admission.acquire(request(400, bucket=LengthBucket.S), max_wait_s=1.0)
                for _ in range(4)]
        clock.now += 0.3
        for reservation in held:
            admission.progress(reservation, 1)
        clock.now += 1.0
        for reservation in held:
            admission.progress(reservation, 10)  # 0.1 s a token: 89 more take 8.9 s
        assert admission.valve.waiting == 0 and admission.ledger.reserved_blocks == 80
        screened = admission.screen(20)
        refused: AdmissionRejected | None = None
        try:
            await admission.acquire(request(400, bucket=LengthBucket.M), max_wait_s=1.0)
        except AdmissionRejected as rejected:
            refused = rejected
        return screened, refused

    screened, refused = asyncio.run(scenario())
    assert isinstance(screened, AdmissionRejected)
    assert screened.reason is RefusalReason.TTFT_SLO
    assert refused is not None and refused.reason is RefusalReason.TTFT_SLO


def test_the_screen_counts_the_requests_it_let_through_until_they_are_sized() -> None:
    """A burst is screened before any of its requests is parsed (the start gate): each one the
    screen lets through counts at the mean admitted prompt until it is sized, so the screen
    refuses the rest of a burst at once. Counted at nothing (the code before), the screen let
    every one of them through to be parsed and refused one by one."""
    clock = FakeClock()

    async def scenario() -> tuple[list[bool], float, AdmissionRejected]:
        admission = controller(blocks=10_000, slo_s=2.0, rate=1000.0, clock=clock)
        # teaches the mean admitted prompt (200 tokens); its first token empties the backlog
        held = await admission.acquire(request(300), max_wait_s=1.0)
        admission.progress(held, 1)
        assert admission.prompt_mean == 200 and admission.valve.backlog == 0
        # cap: 1.4 s × 1,000 tokens a second; the floor, then 6 more of 200 fit (1,400)
        passes = []
        for _ in range(10):
            decided = admission.screen(20)
            passes.append(decided)
        let_through = [isinstance(decided, ScreenPass) for decided in passes]
        pending = admission.pending_tokens
        first = passes[0]
        assert isinstance(first, ScreenPass)
        first.release()
        first.release()  # once only
        after = admission.pending_tokens
        refused = passes[-1]
        assert isinstance(refused, AdmissionRejected)
        return let_through, pending - after, refused

    let_through, released, refused = asyncio.run(scenario())
    assert let_through == [True] * 7 + [False] * 3
    assert released == 200
    assert refused.reason is RefusalReason.TTFT_SLO and refused.bucket is None
    assert refused.backlog_tokens == 1400  # the 7 let through, counted at 200 each


def test_the_screens_refusal_stands_for_the_arrivals_after_it_until_something_changes() -> None:
    """A burst's refusals after the first skip the replay (the screen's costliest part): with
    nothing changed but more screened in, and within REFUSAL_HOLD_S, the decision is the same.
    Less screened in (a pass released), the hold's end, or a token: decided afresh. (The code
    before ran the replay for each of the five refusals.)"""
    clock = FakeClock()

    async def scenario() -> tuple[int, int, list[bool], int, int]:
        admission = controller(blocks=10_000, slo_s=2.0, rate=1000.0, clock=clock)
        held = await admission.acquire(request(300), max_wait_s=1.0)
        admission.progress(held, 1)
        replays: list[int] = []
        predict = admission._predicted_wait

        def counted(*args: Any, **kwargs: Any) -> Any:
            replays.append(1)
            return predict(*args, **kwargs)

        admission._predicted_wait = counted  # type: ignore[method-assign]
        passes = [admission.screen(20) for _ in range(7)]
        assert all(isinstance(decided, ScreenPass) for decided in passes)
        before = len(replays)
        refusals = [admission.screen(20) for _ in range(5)]
        assert all(isinstance(decided, AdmissionRejected) for decided in refusals)
        held_replays = len(replays) - before
        refused = admission.arrivals.refused_by_valve
        first = passes[0]
        assert isinstance(first, ScreenPass)
        first.release()  # less screened in than at the refusal: room for one more
        afresh = [isinstance(admission.screen(20), ScreenPass)]
        afresh.append(isinstance(admission.screen(20), ScreenPass))  # refused, held again
        before = len(replays)
        clock.now += 2 * REFUSAL_HOLD_S
        afresh.append(isinstance(admission.screen(20), ScreenPass))
        after_hold = len(replays) - before
        before = len(replays)
        admission.progress(held, 1)
        afresh.append(isinstance(admission.screen(20), ScreenPass))
        return held_replays, refused, afresh, after_hold, len(replays) - before

    held_replays, refused, afresh, after_hold, after_token = asyncio.run(scenario())
    assert held_replays == 1 and refused == 5  # each refusal still counted
    assert afresh == [True, False, False, False]
    assert after_hold == 1 and after_token == 1


def test_a_held_refusal_says_what_the_refusal_it_stands_for_said_without_looking_again(
) -> None:
    """The refusals a held one stands for carry its figures (backlog, cap, Retry-After) and do
    not look at the waiting requests again (each look walks all of them: two walks, about 20 us
    of the refusal's time with 64 waiting, in every refusal of a burst before); each is still
    counted. (The code before looked twice for every held refusal.)"""
    clock = FakeClock()

    async def scenario() -> tuple[AdmissionRejected, list[AdmissionRejected], int, int]:
        admission = controller(blocks=10_000, slo_s=2.0, rate=1000.0, clock=clock)
        held = await admission.acquire(request(300), max_wait_s=1.0)
        admission.progress(held, 1)
        first = admission.screen(20)
        while isinstance(first, ScreenPass):  # screened in until the first refusal
            first = admission.screen(20)
        looks: list[float] = []
        rate_now = admission.valve.rate_now

        def counted(now: float) -> float:
            looks.append(now)
            return rate_now(now)

        admission.valve.rate_now = counted  # type: ignore[method-assign]
        refused = admission.arrivals.refused_by_valve
        clock.now += REFUSAL_HOLD_S / 2
        again = [admission.screen(20) for _ in range(3)]
        assert all(isinstance(decided, AdmissionRejected) for decided in again)
        return first, again, len(looks), admission.arrivals.refused_by_valve - refused

    first, again, looks, counted_refusals = asyncio.run(scenario())
    assert looks == 0 and counted_refusals == 3
    assert first.backlog_tokens > 0 and first.cap_tokens > 0 and first.retry_after_s is not None
    for rejected in again:
        assert (rejected.backlog_tokens, rejected.cap_tokens, rejected.retry_after_s) == (
            first.backlog_tokens, first.cap_tokens, first.retry_after_s)


def test_a_screened_request_is_sized_by_its_own_prompt() -> None:
    """The estimate only decides the screen: once its turn comes, a request let through is
    decided on its own prompt, which replaces the estimate in the backlog."""
    clock = FakeClock()

    async def scenario() -> tuple[int, float]:
        admission = controller(blocks=10_000, slo_s=2.0, rate=1000.0, clock=clock)
        decided = admission.screen(20)
        assert isinstance(decided, ScreenPass) and decided.tokens == 20  # no mean yet
        decided.release()
        await admission.acquire(request(600), max_wait_s=1.0)
        return admission.valve.backlog, admission.pending_tokens

    assert asyncio.run(scenario()) == (500, 0.0)


def test_a_sized_request_is_refused_beside_the_backlog_only() -> None:
    """The requests screened in after a request arrived after it: its refusal (on its own
    prompt, once sized) reports the backlog it was decided beside, and its Retry-After that
    backlog's drain, not the screened-in tokens (those only decide the screen)."""
    clock = FakeClock()

    async def scenario() -> AdmissionRejected:
        admission = controller(blocks=10_000, slo_s=2.0, rate=1000.0, clock=clock)
        await admission.acquire(request(700), max_wait_s=1.0)  # 600 waiting; mean 600
        later = admission.screen(20)
        assert isinstance(later, ScreenPass) and admission.pending_tokens == 600
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire(request(1000), max_wait_s=1.0)  # 900 more: over 1,400
        return caught.value

    refused = asyncio.run(scenario())
    assert refused.backlog_tokens == 600
    assert refused.retry_after_s == pytest.approx((600 + 900) / 1000 - TARGET_SHARE * 2.0)


def test_one_long_prompt_moves_the_screens_estimate_by_half_not_tenfold() -> None:
    """The estimate is a geometric mean: one 20,000-token prompt among 200-token ones moves it
    by 100 ** 0.1 (58 %), and twenty more short ones bring it back within 10 %. (An arithmetic
    mean moved it from 200 to 2,180, above a cap of 1,400: the screen then let one request of a
    burst through instead of seven.)"""

    async def scenario() -> list[float]:
        admission = controller(blocks=100_000, slo_s=30.0, rate=1e6, max_running=256)
        means = []
        for prompt in [200, 20_000] + [200] * 20:
            held = await admission.acquire(request(prompt + 100), max_wait_s=1.0)
            admission.progress(held, 1)
            admission.release(held, completion_tokens=1)
            assert admission.prompt_mean is not None
            means.append(admission.prompt_mean)
        return means

    means = asyncio.run(scenario())
    assert means[0] == 200
    assert means[1] == pytest.approx(200 * 100 ** 0.1)
    assert means[-1] < 220
