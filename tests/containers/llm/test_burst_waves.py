"""The burst benchmark's wave table (benchmarks/admission_common.py: ``waves``, ``wave_pace``):
where a burst's first wave of first tokens ends and its second begins, and how the second moves
with the first over rounds (docs/gateway.md#surges, "Twenty-third round")."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.support.benchmark_module import load_benchmark


@pytest.fixture(scope="module")
def common() -> ModuleType:
    return load_benchmark("admission_common")


def burst(first_end_ms: float, second_start_ms: float) -> list[float]:
    """A burst's first tokens as vLLM's CPU build starts them: a lone first request, the first
    wave's prefill batches 0.1-0.25 s apart up to ``first_end_ms``, then the second wave's
    batches from ``second_start_ms`` (listed out of order, as the client records them)."""
    return ([second_start_ms + 230] * 8 + [70] + [300] * 7 + [530] * 7
            + [first_end_ms] * 5 + [second_start_ms] * 5)


def test_the_first_gap_of_400_ms_ends_the_first_wave(common: ModuleType) -> None:
    """The first wave ends at its last batch and the second begins after the gap; batches
    within a wave (230 ms apart here) do not split it, a gap of exactly 400 ms does, and a
    burst that the pool holds at once is one wave."""
    assert common.waves(burst(680, 1600)) == common.Waves(680, 1600)
    assert common.waves([70, 300, 530, 930, 1200]) == common.Waves(530, 930)
    assert common.waves([70, 300, 530, 680]) is None
    assert common.waves([]) is None


def test_the_second_wave_is_fitted_against_the_first(common: ModuleType) -> None:
    """Five rounds whose second wave starts 300 ms plus twice the first wave's end: a slope of
    2 ms per ms, r = 1, and each wave's p10 / p50 / p90. Fewer than three rounds, or a first
    wave that always ends at the same time, fit nothing."""
    ends = [600.0, 650.0, 700.0, 800.0, 900.0]
    found = [common.waves(burst(end, 300 + 2 * end)) for end in ends]
    pace = common.wave_pace(found)
    assert pace.rounds == 5
    assert pace.slope == pytest.approx(2.0)
    assert pace.correlation == pytest.approx(1.0)
    assert pace.first_last_ms[1] == 700.0
    assert pace.second_first_ms[1] == 1700.0
    assert pace.first_last_ms[0] < 700.0 < pace.first_last_ms[2]
    assert common.wave_pace(found[:2]) is None
    assert common.wave_pace([common.Waves(700, 1600), common.Waves(700, 1700),
                             common.Waves(700, 1800)]) is None
