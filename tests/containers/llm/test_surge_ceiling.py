"""The sustained-surge benchmark's ceiling (benchmarks/admission_common.py: ``Ceiling``,
``best_closed_loop``; benchmarks/admission_surge.py: ``prompt_blocks``, ``ceiling_table``): the most
answers within the SLO any admission could give on the engine, and each server's share of it
(docs/gateway.md#surges, "Twenty-fourth round")."""

from __future__ import annotations

import math
from types import ModuleType

import pytest

from tests.support.benchmark_module import load_benchmark


@pytest.fixture(scope="module")
def common() -> ModuleType:
    return load_benchmark("admission_common")


@pytest.fixture(scope="module")
def surge() -> ModuleType:
    return load_benchmark("admission_surge")


def test_the_bound_is_the_best_loops_rate_over_the_runs_window_and_what_the_pool_holds(
        common: ModuleType) -> None:
    """Every first token within the SLO comes within the arrivals' 40 s + the 2 s SLO; by then
    the answer ended (7.5 a second at most, from an idle start) or still runs (8 at most)."""
    ceiling = common.Ceiling(rate=7.5, clients=8, held=8)
    assert ceiling.bound(40.0, 2.0) == pytest.approx(7.5 * 42 + 8)
    assert ceiling.bound(10.0, 2.0) == pytest.approx(7.5 * 12 + 8)


def test_the_best_closed_loop_is_the_one_that_completed_most_not_the_largest(
        common: ModuleType) -> None:
    """Past the pool's size a larger loop preempts and completes less (vLLM's CPU build: 7.48 a
    second with 8 clients on the long prompts, 6.90 with 32)."""
    assert common.best_closed_loop({8: 7.48, 16: 7.11, 32: 6.90, 64: 7.20}) == (8, 7.48)
    with pytest.raises(ValueError, match="at least one"):
        common.best_closed_loop({})


def test_a_prompt_takes_its_messages_with_the_templates_tokens_and_a_first_answer_token(
        surge: ModuleType) -> None:
    """Two messages of 10 and 20 tokens: 10 + 5 + 20 + 5 + 1 = 41 prompt tokens and the first
    answer token, 42, are two blocks of 32; 26 more tokens are three."""
    messages = [{"role": "system", "content": "a" * 10}, {"role": "user", "content": "b" * 20}]
    assert surge.prompt_blocks(messages, len, 32) == 2
    messages[1]["content"] = "b" * 53
    assert surge.prompt_blocks(messages, len, 32) == 3


def figures(common: ModuleType, good: float) -> object:
    return common.Figures(sent=500, good=good, admitted=good, refused=500 - good, errors=0,
                          ttft_p50_ms=800.0, ttft_p99_ms=1500.0, refusal_p50_ms=3.0,
                          refusal_p99_ms=5.0, refusal_max_ms=9.0)


def test_the_table_gives_each_servers_share_of_the_ceiling_and_what_the_target_asks(
        common: ModuleType, surge: ModuleType) -> None:
    """The valve tuned on the short chats (the 3,000 valve here, 560 against 540) is the one the
    long mix's target multiplies by 1.1: 274 → 301, 93 % of a ceiling of 323."""
    plan = surge.Plan(mixes=["short", "long"], multiples=[2], repeats=3, duration_s=40.0,
                      slo_ms=2000.0, server_nice=0,
                      servers=["gateway", "vllm-q1500", "vllm-q3000"])
    good = {("short", "gateway"): 567, ("short", "vllm-q1500"): 540,
            ("short", "vllm-q3000"): 560, ("long", "gateway"): 263,
            ("long", "vllm-q1500"): 277, ("long", "vllm-q3000"): 274}
    summary = {(mix, 2.0, name): figures(common, value) for (mix, name), value in good.items()}
    ceilings = {"short": common.Ceiling(16.2, 16, 21), "long": common.Ceiling(7.5, 8, 8)}
    lines = surge.ceiling_table(summary, plan, ceilings).splitlines()
    assert lines[0].startswith("| mix | multiple | ceiling")
    assert "| gateway | vllm-q1500 | vllm-q3000 |" in lines[0]
    short, long = lines[2], lines[3]
    assert short.startswith("| short | 2× | 16.20/s (16 clients) × 42 s + 21 → 701 |")
    assert "| 567 (81%) |" in short and short.endswith("| 560 (80%) |")
    assert long.startswith("| long | 2× | 7.50/s (8 clients) × 42 s + 8 → 323 |")
    assert "| 263 (81%) | 277 (86%) | 274 (85%) |" in long
    assert long.endswith(f"| {1.1 * 274:.0f} ({1.1 * 274 / (7.5 * 42 + 8):.0%}) |")
    assert math.isclose(1.1 * 274 / 323, 0.933, abs_tol=0.001)
