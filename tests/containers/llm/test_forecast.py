"""The first-token forecast (pure): what it learns from the streams, and the dispatch replay."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.forecast import (
    NEVER,
    DispatchRules,
    InFlight,
    OutputLengths,
    PrefillModel,
    Queued,
    StepModel,
    StepPrior,
    first_token_in_s,
)

RULES = DispatchRules(limit_tokens=1000, max_running=8, bucket_caps={"S": 8, "L": 2})


def step_10ms(running: float) -> float:
    return 0.010


def no_prefill(tokens: float) -> float:
    return 0.0


def test_the_step_model_learns_the_line_from_two_batch_sizes() -> None:
    model = StepModel(StepPrior(step_s=0.05, step_s_per_sequence=0.01))  # ten times too slow
    for _ in range(3000):
        model.observe(1, 0.004)
        model.observe(16, 0.004 + 15 * 0.0005)
    slope = model.line()[1]
    assert slope == pytest.approx(0.0005, rel=0.02)
    assert model.step_s(1) == pytest.approx(0.004, rel=0.02)
    assert model.step_s(32) == pytest.approx(0.004 + 31 * 0.0005, rel=0.03)


def test_one_batch_size_alone_keeps_the_priors_slope_and_moves_the_level() -> None:
    model = StepModel(StepPrior(step_s=0.03, step_s_per_sequence=0.002))
    for _ in range(5000):
        model.observe(1, 0.003)
    assert model.step_s(1) == pytest.approx(0.003, rel=0.05)
    assert model.line()[1] > 0  # still grows with the batch


def test_the_step_model_ignores_nonsense() -> None:
    model = StepModel()
    before = model.line()
    for running, seconds, tokens in ((0, 0.01, 1), (3, -1.0, 1), (3, 100.0, 1), (3, 0.01, 0)):
        model.observe(running, seconds, tokens)
    assert model.line() == before and model.observations == 0


def test_prefill_rate_replaces_its_prior_and_skips_tiny_prompts() -> None:
    model = PrefillModel(StepPrior(prefill_tokens_per_s=2000))
    model.observe(8, 0.001)
    assert model.tokens_per_s == 2000
    model.observe(1000, 0.1)
    assert model.tokens_per_s == pytest.approx(10_000)
    assert model.seconds(500) == pytest.approx(0.05)


def test_answer_lengths_are_trusted_only_when_few_were_cut() -> None:
    lengths = OutputLengths(min_answers=20)
    for tokens in range(10, 29):
        lengths.observe(tokens, capped=False)
    assert lengths.typical() is None  # 19 answers: too few
    assert lengths.expected(512) == 512
    lengths.observe(100, capped=False)
    assert lengths.typical() == 28  # the 90th percentile of 20 natural lengths (10-28, 100)
    assert lengths.expected(16) == 16 and lengths.expected(512) == 28
    for _ in range(3):
        lengths.observe(64, capped=True)  # 3 of 23 cut: no longer a natural percentile
    assert lengths.typical() is None


def test_an_idle_engine_answers_after_the_prefill_and_one_step() -> None:
    new = Queued(tokens=100, prompt_tokens=400, output_tokens=50, bucket="S")
    forecast = first_token_in_s([], [], new, rules=RULES, step_s=step_10ms,
                                prefill_s=lambda tokens: tokens / 10_000)
    assert forecast == pytest.approx(0.04 + 0.01)


def test_a_full_pool_makes_the_new_request_wait_for_room() -> None:
    running = [InFlight(tokens=500, remaining_output=30, prefill_tokens=0, bucket="S"),
               InFlight(tokens=500, remaining_output=80, prefill_tokens=0, bucket="S")]
    new = Queued(tokens=400, prompt_tokens=0, output_tokens=10, bucket="S")
    forecast = first_token_in_s(running, [], new, rules=RULES, step_s=step_10ms,
                                prefill_s=no_prefill)
    assert forecast == pytest.approx(30 * 0.010 + 0.010)  # the first one's 30 tokens, one step


def test_the_queue_ahead_is_served_first() -> None:
    running = [InFlight(tokens=1000, remaining_output=10, prefill_tokens=0, bucket="S")]
    ahead = [Queued(tokens=1000, prompt_tokens=0, output_tokens=20, bucket="S")]
    new = Queued(tokens=1000, prompt_tokens=0, output_tokens=5, bucket="S")
    forecast = first_token_in_s(running, ahead, new, rules=RULES, step_s=step_10ms,
                                prefill_s=no_prefill)
    assert forecast == pytest.approx((10 + 20) * 0.010 + 0.010)


def test_a_request_blocked_by_its_bucket_lets_others_pass() -> None:
    running = [InFlight(tokens=100, remaining_output=50, prefill_tokens=0, bucket="L")
               for _ in range(2)]  # the L cap (2) is full
    ahead = [Queued(tokens=100, prompt_tokens=0, output_tokens=10, bucket="L")]
    new = Queued(tokens=100, prompt_tokens=0, output_tokens=10, bucket="S")
    forecast = first_token_in_s(running, ahead, new, rules=RULES, step_s=step_10ms,
                                prefill_s=no_prefill)
    assert forecast == pytest.approx(0.010)


def test_prefills_run_one_after_another() -> None:
    running = [InFlight(tokens=100, remaining_output=5, prefill_tokens=2000, bucket="S")]
    new = Queued(tokens=100, prompt_tokens=1000, output_tokens=5, bucket="S")
    forecast = first_token_in_s(running, [], new, rules=RULES, step_s=step_10ms,
                                prefill_s=lambda tokens: tokens / 10_000)
    assert forecast == pytest.approx(0.2 + 0.1 + 0.01)


def test_a_request_larger_than_the_pool_never_fits() -> None:
    new = Queued(tokens=1001, prompt_tokens=0, output_tokens=1, bucket="S")
    assert first_token_in_s([], [], new, rules=RULES, step_s=step_10ms,
                            prefill_s=no_prefill) == NEVER


def test_steps_slow_down_with_the_batch() -> None:
    running = [InFlight(tokens=100, remaining_output=10 * (i + 1), prefill_tokens=0, bucket="S")
               for i in range(8)]
    new = Queued(tokens=100, prompt_tokens=0, output_tokens=10, bucket="S")
    flat = first_token_in_s(running, [], new, rules=RULES, step_s=step_10ms,
                            prefill_s=no_prefill)
    growing = first_token_in_s(running, [], new, rules=RULES,
                               step_s=lambda n: 0.005 * n, prefill_s=no_prefill)
    assert flat == pytest.approx(10 * 0.010 + 0.010)  # max_running 8: waits for the first
    assert growing == pytest.approx(10 * 0.040 + 0.040)


items = st.builds(Queued, tokens=st.integers(1, 600), prompt_tokens=st.integers(0, 500),
                  output_tokens=st.integers(1, 200), bucket=st.sampled_from(["S", "L"]))
flights = st.builds(InFlight, tokens=st.integers(1, 300), remaining_output=st.integers(1, 200),
                    prefill_tokens=st.integers(0, 500), bucket=st.sampled_from(["S", "L"]))


@settings(max_examples=300, deadline=None)
@given(running=st.lists(flights, max_size=6), queued=st.lists(items, max_size=12), new=items,
       extra=items)
def test_more_work_ahead_never_brings_the_first_token_sooner_by_more_than_a_step(
        running: list[InFlight], queued: list[Queued], new: Queued, extra: Queued) -> None:
    rules = DispatchRules(limit_tokens=2000, max_running=8, bucket_caps={"S": 8, "L": 2})

    def forecast(ahead: list[Queued]) -> float:
        return first_token_in_s(running, ahead, new, rules=rules,
                                step_s=lambda n: 0.002 + 0.001 * n,
                                prefill_s=lambda tokens: tokens / 5000)

    base = forecast(queued)
    longer = forecast([*queued, extra])
    assert base >= 0 and math.isfinite(base)
    # To within one engine step: a request dispatched later may run in a smaller batch while the
    # prefills ahead of it still run (the replay's resolution is one step).
    assert longer >= base - (0.002 + 0.001 * (rules.max_running + 1))
