"""KV-aware admission: block rounding, buckets, watermark, caps; refusals on arrival from the
first-token forecast, first-come-first-served dispatch, and what the streams teach it."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from gateway.admission import (
    AdmissionController,
    AdmissionLedger,
    AdmissionRejected,
    AdmissionRequest,
    ForecastStats,
    KvReservation,
    LengthBucket,
    RefusalReason,
    blocks_for_tokens,
    classify_bucket,
    retry_after_header,
)
from gateway.chat_types import ApiError, FinishEvent, TextEvent
from gateway.engines.base import KvCapacity
from gateway.forecast import StepPrior
from request_buckets import bucket_bounds
from tests.containers.llm.harness import chat_request, new_record

BOUNDS = bucket_bounds(4096)  # S ≤ 512, M ≤ 1,024, L ≤ 2,048
CAPS = {"S": 4, "M": 3, "L": 2, "XL": 1}


def ledger(blocks: int = 100, watermark: float = 0.9) -> AdmissionLedger:
    return AdmissionLedger(KvCapacity(blocks, 16), watermark=watermark, bucket_caps=CAPS)


@pytest.mark.parametrize(("tokens", "blocks"), [(0, 0), (1, 1), (16, 1), (17, 2), (4096, 256)])
def test_reservations_round_up_to_whole_blocks(tokens: int, blocks: int) -> None:
    assert blocks_for_tokens(tokens, 16) == blocks


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


def controller(blocks: int = 100, *, slo_s: float = 2.0, watermark: float = 0.9,
               max_running: int = 64, probe_interval_s: float = math.inf,
               clock: Any = time.monotonic) -> AdmissionController:
    """A controller whose forecast believes 10 ms per engine step and instant prefills (and,
    unless ``probe_interval_s`` is given, that never probes its forecast)."""
    made = AdmissionController(ledger(blocks=blocks, watermark=watermark), ttft_slo_s=slo_s,
                               max_running=max_running, probe_interval_s=probe_interval_s,
                               clock=clock,
                               prior=StepPrior(step_s=0.010, step_s_per_sequence=0.0,
                                               first_token_s=0.010, prefill_tokens_per_s=1e9))
    return made


def request(tokens: int, max_tokens: int = 100, bucket: LengthBucket = LengthBucket.L
            ) -> AdmissionRequest:
    return AdmissionRequest(bucket=bucket, prompt_tokens=tokens - max_tokens,
                            max_tokens=max_tokens)


def test_a_request_that_fits_is_dispatched_at_once() -> None:
    async def scenario() -> tuple[KvReservation, float]:
        admission = controller()
        reservation = await admission.acquire(request(1000), max_wait_s=1.0)
        return reservation, admission.forecasts.samples

    reservation, _ = asyncio.run(scenario())
    assert reservation.blocks == 57  # its 900 prompt tokens and its first token, blocks of 16
    assert reservation.forecast_ttft_s == pytest.approx(0.010, rel=1e-3)


def test_a_request_that_would_miss_the_slo_is_refused_at_once_with_a_retry_after() -> None:
    async def scenario() -> tuple[AdmissionRejected, float, int]:
        admission = controller(slo_s=0.5)
        held = await admission.acquire(request(1300), max_wait_s=1.0)  # 82 of 90 blocks
        # Queued behind it: its first token after the running one's 100 tokens (1 s) > 0.5 s.
        started = time.perf_counter()
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire(request(1300), max_wait_s=5.0)
        elapsed = time.perf_counter() - started
        admission.release(held)
        return caught.value, elapsed, admission.waiting

    rejected, elapsed, waiting = asyncio.run(scenario())
    assert rejected.reason is RefusalReason.TTFT_SLO
    assert elapsed < 0.05 and rejected.waited_s == 0.0  # refused on arrival, not after a wait
    assert rejected.forecast_ttft_s == pytest.approx(100 * 0.010 + 0.010, rel=1e-3)
    assert rejected.retry_after_s == pytest.approx(0.51, rel=1e-3)
    assert retry_after_header(rejected.retry_after_s, 1) == "1"
    assert retry_after_header(120.0, 1) == "60" and retry_after_header(None, 2) == "2"
    assert waiting == 0


def test_queued_requests_are_dispatched_first_come_first_served() -> None:
    async def scenario() -> list[int]:
        admission = controller(slo_s=10.0)
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


def test_a_request_queued_past_the_safety_net_is_shed() -> None:
    async def scenario() -> AdmissionRejected:
        admission = controller(slo_s=10.0)
        await admission.acquire(request(1300), max_wait_s=1.0)
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire(request(1300), max_wait_s=0.05)
        assert admission.waiting == 0
        return caught.value

    rejected = asyncio.run(scenario())
    assert rejected.reason is RefusalReason.QUEUE_TIMEOUT
    assert rejected.waited_s >= 0.04


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


def test_the_streams_teach_the_step_time_and_the_answer_lengths() -> None:
    clock = FakeClock()

    async def scenario() -> AdmissionController:
        admission = AdmissionController(ledger(blocks=1000), ttft_slo_s=2.0, max_running=64,
                                        clock=clock)
        reservations = [await admission.acquire(request(200, 100, LengthBucket.S),
                                                max_wait_s=1.0) for _ in range(4)]
        for _ in range(200):
            clock.now += 0.008
            for reservation in reservations:
                admission.progress(reservation, 1)
        for reservation in reservations:
            admission.release(reservation, completion_tokens=40, capped=False)
        return admission

    admission = asyncio.run(scenario())
    assert admission.steps.step_s(4) == pytest.approx(0.008, rel=0.1)  # the prior: 36 ms
    assert admission.forecasts.samples + admission.first_tokens.samples == 4
    assert admission.lengths.typical() is None  # 4 answers are not enough to trust
    assert admission.ledger.reserved_blocks == 0


def test_a_caller_that_goes_away_while_queued_leaves_nothing_behind() -> None:
    async def scenario() -> AdmissionController:
        admission = controller(slo_s=10.0)
        held = await admission.acquire(request(1300), max_wait_s=1.0)
        task = asyncio.create_task(admission.acquire(request(1300), max_wait_s=5.0))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        admission.release(held)
        return admission

    admission = asyncio.run(scenario())
    assert admission.waiting == 0
    assert admission.ledger.reserved_blocks == 0 and admission.ledger.total_inflight == 0


def test_many_requests_are_served_or_refused_without_leaks() -> None:
    async def scenario() -> tuple[AdmissionController, dict[str, int]]:
        admission = controller(blocks=64, watermark=1.0, slo_s=0.5)
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
            admission.release(reservation)
            outcomes["served"] += 1

        await asyncio.gather(*(one(100 + (i * 37) % 900) for i in range(200)))
        return admission, outcomes

    admission, outcomes = asyncio.run(scenario())
    assert outcomes["served"] + outcomes["refused"] == 200
    assert outcomes["served"] > 0 and outcomes["refused"] > 0
    assert admission.ledger.reserved_blocks == 0
    assert admission.ledger.total_inflight == 0
    assert admission.waiting == 0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_forecasts_that_proved_optimistic_are_scaled_up() -> None:
    """First tokens that came twice as late as forecast double later forecasts: a request the
    raw replay would admit (0.31 s) is refused against a 0.5 s SLO (0.62 s)."""
    async def scenario(late: bool) -> RefusalReason | None:
        admission = controller(slo_s=0.5)
        if late:
            for _ in range(20):
                admission.forecasts.observe(2.0, 1.0, slo_s=0.5)
        held = await admission.acquire(request(1300, 30), max_wait_s=1.0)
        try:
            await admission.acquire(request(1300, 30), max_wait_s=0.01)
        except AdmissionRejected as rejected:
            return rejected.reason
        finally:
            admission.release(held)
        return None

    assert asyncio.run(scenario(late=False)) is RefusalReason.QUEUE_TIMEOUT  # admitted, queued
    assert asyncio.run(scenario(late=True)) is RefusalReason.TTFT_SLO


def test_the_calibration_moves_both_ways_is_bounded_and_ignores_tiny_forecasts() -> None:
    stats = ForecastStats()
    assert stats.calibration() == 1.0
    stats.observe(1.0, 0.1, slo_s=2.0)  # a 100 ms forecast: fixed costs, not the replay's error
    assert stats.ratio_median() is None and stats.samples == 1 and stats.calibration() == 1.0
    for _ in range(20):
        stats.observe(0.5, 1.0, slo_s=2.0)
    assert stats.calibration() == pytest.approx(0.5, rel=0.01)  # early shortens it too
    stats.observe(1.0, 1.0, slo_s=2.0)  # one first token right on time moves it by the gain
    assert stats.calibration() == pytest.approx(0.5 ** 0.7, rel=0.01)
    for _ in range(100):
        stats.observe(10.0, 1.0, slo_s=2.0)
    assert stats.calibration() == 4.0 and stats.late == 100
    for _ in range(100):
        stats.observe(0.0001, 1.0, slo_s=2.0)
    assert stats.calibration() == pytest.approx(1 / 64)
    stats.reset()
    assert stats.calibration() == 1.0 and stats.samples == 0 and stats.ratio_median() is None


def test_the_calibration_crosses_a_tenfold_pessimism_within_seven_first_tokens() -> None:
    """The worst case docs/design-decisions.md#forecast-lock-out states: a forecast 64 times
    too pessimistic for a request that really takes two thirds of the SLO is within the SLO
    after seven first tokens (gain 0.3: the excess shrinks to 0.7^k of its logarithm)."""
    stats = ForecastStats()
    slo_s, actual_s, raw_s = 2.0, 2.0 / 1.5, 64 * 2.0 / 1.5
    tokens = 0
    while raw_s * stats.calibration() > slo_s:
        stats.observe(actual_s, raw_s, slo_s=slo_s)
        tokens += 1
    assert tokens == 7


def choices_request(tokens: int, max_tokens: int = 100, sequences: int = 3,
                    bucket: LengthBucket = LengthBucket.S) -> AdmissionRequest:
    return AdmissionRequest(bucket=bucket, prompt_tokens=tokens - max_tokens,
                            max_tokens=max_tokens, sequences=sequences)


def test_a_request_of_three_choices_runs_three_of_max_running() -> None:
    """max_running is the engine's max_num_seqs: n=3 takes three sequences, so with four slots
    a second n=3 request waits (and the forecast knows it) while a single-choice one fits."""
    async def scenario() -> tuple[int, int, float, float, RefusalReason | None]:
        admission = controller(blocks=1000, slo_s=10.0, max_running=4)
        held = await admission.acquire(choices_request(200), max_wait_s=1.0)
        running = admission.running_sequences
        alone = admission.forecast_ttft_s(request(200, 100, LengthBucket.S))
        behind = admission.forecast_ttft_s(choices_request(200))
        single = await admission.acquire(request(200, 100, LengthBucket.S), max_wait_s=1.0)
        reason = None
        try:
            await admission.acquire(choices_request(200), max_wait_s=0.02)
        except AdmissionRejected as rejected:
            reason = rejected.reason
        full = admission.running_sequences
        admission.release(single)
        admission.release(held)
        return running, full, alone, behind, reason

    running, full, alone, behind, reason = asyncio.run(scenario())
    assert running == 3 and full == 4
    assert alone == pytest.approx(0.010, rel=1e-3)  # the fourth slot is free
    # Three more sequences wait for the running three to finish their 100 tokens each (1 s).
    assert behind == pytest.approx(100 * 0.010 + 0.010, rel=1e-3)
    assert reason is RefusalReason.QUEUE_TIMEOUT  # admitted, but waited for its three slots


def test_more_choices_than_max_running_never_fit() -> None:
    async def scenario() -> RefusalReason:
        admission = controller(blocks=1000, max_running=2)
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire(choices_request(200), max_wait_s=1.0)
        return caught.value.reason

    assert asyncio.run(scenario()) is RefusalReason.NEVER_FITS


def test_three_choices_reserve_three_answers_and_wait_their_longest_remaining_output() -> None:
    """The KV holds the prompt once and each choice's answer; as its choices stream, the
    replay expects each sequence to need max_tokens less what that sequence produced."""
    clock = FakeClock()

    async def scenario() -> tuple[KvReservation, float, float]:
        admission = AdmissionController(
            ledger(blocks=1000), ttft_slo_s=100.0, max_running=3, clock=clock,
            prior=StepPrior(step_s=0.010, step_s_per_sequence=0.0, first_token_s=0.010,
                            prefill_tokens_per_s=1e9))
        held = await admission.acquire(choices_request(300), max_wait_s=1.0)
        before = admission.forecast_ttft_s(request(200, 100, LengthBucket.S))
        for _ in range(40):  # 40 tokens of each of its 3 choices
            clock.now += 0.010
            for choice in range(3):
                admission.progress(held, 1, choice=choice)
        after = admission.forecast_ttft_s(request(200, 100, LengthBucket.S))
        return held, before, after

    held, before, after = asyncio.run(scenario())
    assert held.tokens == 200 + 3  # dispatched holding its prompt and each choice's first token
    assert before == pytest.approx(100 * 0.010 + 0.010, rel=1e-3)
    assert after == pytest.approx(60 * 0.010 + 0.010, rel=1e-2)  # not 100 - 120 tokens


def test_the_choices_stream_one_sequence_pace_each() -> None:
    """Deltas of the three choices arrive in the same step: the pace is per choice (10 ms a
    token), not the gap between two choices' deltas."""
    clock = FakeClock()

    async def scenario() -> AdmissionController:
        admission = AdmissionController(ledger(blocks=1000), ttft_slo_s=2.0, max_running=64,
                                        clock=clock)
        held = await admission.acquire(choices_request(300), max_wait_s=1.0)
        for _ in range(300):
            clock.now += 0.010
            for choice in range(3):
                admission.progress(held, 1, choice=choice)
                clock.now += 0.0001
        admission.release(held)
        return admission

    admission = asyncio.run(scenario())
    assert admission.steps.step_s(3) == pytest.approx(0.0103, rel=0.1)


def test_the_learned_answer_length_is_per_choice() -> None:
    """An n=3 request whose usage counts 120 completion tokens taught 3 answers of 40."""
    async def scenario() -> AdmissionController:
        admission = controller(blocks=1000)
        for _ in range(7):
            reservation = await admission.acquire(choices_request(300), max_wait_s=1.0)
            for choice in range(3):
                admission.progress(reservation, 40, choice=choice)
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


def test_warmup_is_queued_not_refused_by_the_forecast() -> None:
    """Warmup teaches the forecast; refused by it (a loaded machine, a long warmup prompt) it
    could never complete and /ping would never turn healthy. It queues and is dispatched."""
    async def scenario() -> tuple[AdmissionRejected, KvReservation]:
        admission = controller(slo_s=0.5)
        held = await admission.acquire(request(1300), max_wait_s=1.0)
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire(request(1300), max_wait_s=5.0)
        waiting = asyncio.ensure_future(
            admission.acquire(request(1300), max_wait_s=5.0, by_forecast=False))
        await asyncio.sleep(0)
        assert admission.waiting == 1  # queued behind the running one, not refused
        admission.release(held)
        return caught.value, await waiting

    rejected, warmup = asyncio.run(scenario())
    assert rejected.reason is RefusalReason.TTFT_SLO
    assert warmup.blocks > 0


# --- a forecast that can never lock the gateway out (docs/design-decisions.md#forecast-lock-out)
def pessimistic(clock: FakeClock, *, probe_interval_s: float = math.inf,
                slo_s: float = 0.5) -> AdmissionController:
    """A controller whose forecast learned 3 s to a first token (a one-off compile, seen by 40
    warmup requests)."""
    made = AdmissionController(
        AdmissionLedger(KvCapacity(1000, 16), watermark=0.9,
                        bucket_caps=dict.fromkeys(CAPS, 64)),
        ttft_slo_s=slo_s, max_running=64, clock=clock, probe_interval_s=probe_interval_s,
        prior=StepPrior(step_s=0.010, step_s_per_sequence=0.0, first_token_s=3.0,
                        prefill_tokens_per_s=1e9))
    for prompt_tokens in (100, 200, 300, 400) * 10:
        made.first_token.observe(prompt_tokens, 3.0)
    return made


def test_an_idle_engine_never_refuses_whatever_the_forecast_says() -> None:
    """Nothing running, nothing queued: the forecast has nobody to protect, so the request is
    dispatched (and counted); the next one, competing with it, is refused by the forecast, and
    since the engine is nearly idle that refusal is flagged."""
    async def scenario() -> tuple[KvReservation, AdmissionRejected, AdmissionController]:
        admission = pessimistic(FakeClock())
        held = await admission.acquire(request(300, bucket=LengthBucket.S), max_wait_s=1.0)
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire(request(300, bucket=LengthBucket.S), max_wait_s=1.0)
        admission.release(held)
        return held, caught.value, admission

    held, rejected, admission = asyncio.run(scenario())
    assert held.override == "idle" and held.forecast_ttft_s == pytest.approx(3.0)
    assert rejected.reason is RefusalReason.TTFT_SLO and rejected.while_idle
    arrivals = admission.arrivals
    assert (arrivals.idle_admits, arrivals.refused_by_forecast, arrivals.refused_while_idle) == (
        1, 1, 1)
    assert admission.idle_forecast_s(200) == pytest.approx(3.0)


def test_a_refusal_under_load_is_not_flagged_as_idle() -> None:
    async def scenario() -> AdmissionRejected:
        admission = pessimistic(FakeClock())
        admission.max_running = 8  # nearly idle: at most one running
        held = [await admission.acquire(request(300, bucket=LengthBucket.S), max_wait_s=1.0)]
        admission.learning = False
        held.append(await admission.acquire(request(300, bucket=LengthBucket.S), max_wait_s=1.0,
                                            by_forecast=False))
        with pytest.raises(AdmissionRejected) as caught:
            await admission.acquire(request(300, bucket=LengthBucket.S), max_wait_s=1.0)
        for reservation in held:
            admission.release(reservation)
        return caught.value

    rejected = asyncio.run(scenario())
    assert rejected.reason is RefusalReason.TTFT_SLO and not rejected.while_idle


def test_while_refusing_by_forecast_one_request_a_probe_interval_is_admitted() -> None:
    async def scenario() -> list[str | None]:
        clock = FakeClock()
        admission = pessimistic(clock, probe_interval_s=1.0)
        outcomes: list[str | None] = []
        held = []
        for step in range(9):  # one arrival every 0.25 s for 2 s
            try:
                held.append(await admission.acquire(request(300, bucket=LengthBucket.S),
                                                    max_wait_s=1.0))
                outcomes.append(held[-1].override)
            except AdmissionRejected as rejected:
                outcomes.append(rejected.reason.value)
            clock.now += 0.25
            del step
        for reservation in held:
            admission.release(reservation)
        return outcomes

    assert asyncio.run(scenario()) == [
        "idle", "probe", "ttft_slo", "ttft_slo", "ttft_slo", "probe", "ttft_slo", "ttft_slo",
        "ttft_slo"]


def test_a_pessimistic_forecast_recovers_within_the_stated_time_while_requests_keep_arriving(
) -> None:
    """The lock-out of issue 30, in the controller: the forecast learned 3 s to a first token
    that really comes in 0.1 s; requests arrive every 0.25 s and each runs 2 s, so the engine
    is never idle again. The probes' first tokens correct the calibration: within the stated
    bound (docs/design-decisions.md#forecast-lock-out: k probe intervals plus one first token,
    k = 2 here) every arrival is admitted by its forecast, no override needed."""
    async def scenario() -> tuple[float | None, list[str]]:
        clock = FakeClock()
        start = clock.now
        admission = pessimistic(clock, probe_interval_s=1.0, slo_s=1.0)
        running: list[tuple[float, float, KvReservation]] = []  # first token at, end, held
        recovered_at: float | None = None
        outcomes: list[str] = []
        while clock.now - start < 12.0:
            for entry in [e for e in running if e[0] <= clock.now]:
                admission.progress(entry[2], 1)
                running[running.index(entry)] = (math.inf, entry[1], entry[2])
            for entry in [e for e in running if e[1] <= clock.now]:
                running.remove(entry)
                admission.release(entry[2])
            try:
                held = await admission.acquire(request(300, bucket=LengthBucket.S),
                                               max_wait_s=1.0)
                running.append((clock.now + 0.1, clock.now + 2.0, held))
                outcomes.append(held.override or "forecast")
                if held.override is None and recovered_at is None:
                    recovered_at = clock.now - start
            except AdmissionRejected as rejected:
                outcomes.append(rejected.reason.value)
            clock.now += 0.25
        for entry in running:
            admission.release(entry[2])
        return recovered_at, outcomes

    recovered_at, outcomes = asyncio.run(scenario())
    assert recovered_at is not None and recovered_at <= 2 * 1.0 + 0.1 + 0.25, outcomes
    after = outcomes[int(recovered_at / 0.25):]
    assert set(after) == {"forecast"}, outcomes
