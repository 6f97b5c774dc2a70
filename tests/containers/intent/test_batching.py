"""intent_server.batching: how many compiled-batch calls a request takes, chosen by measured
cost."""

from __future__ import annotations

import pytest

from intent_server.batching import BatchCall, call_costs, plan_batches


def test_measured_latency_decides_between_padding_and_more_calls() -> None:
    cheap_big_batch = call_costs((1, 8), {1: 4.0, 8: 9.0})
    assert plan_batches(3, cheap_big_batch) == [BatchCall(0, 3, 8)]
    dear_big_batch = call_costs((1, 8), {1: 40.0, 8: 300.0})
    assert plan_batches(3, dear_big_batch) == [BatchCall(0, 1, 1), BatchCall(1, 1, 1),
                                               BatchCall(2, 1, 1)]
    assert plan_batches(9, cheap_big_batch) == [BatchCall(0, 8, 8), BatchCall(8, 1, 1)]
    assert plan_batches(0, cheap_big_batch) == []


def test_without_measurements_cost_is_proportional_with_call_overhead() -> None:
    costs = call_costs((1, 4), None)
    assert costs == {1: 2.0, 4: 5.0}
    assert plan_batches(2, costs) == [BatchCall(0, 1, 1), BatchCall(1, 1, 1)]
    assert plan_batches(3, costs) == [BatchCall(0, 3, 4)]
    assert call_costs((1, 4), {1: 3.0}) == costs, "partial measurements are not used"


@pytest.mark.parametrize("count", range(40))
def test_every_plan_covers_each_text_exactly_once(count: int) -> None:
    costs = call_costs((1, 4, 16), {1: 3.0, 4: 5.0, 16: 12.0})
    calls = plan_batches(count, costs)
    covered = [i for call in calls for i in range(call.start, call.start + call.count)]
    assert covered == list(range(count))
    assert all(1 <= call.count <= call.batch_size for call in calls)
    assert sum(call.padding > 0 for call in calls) <= 1


def test_batch_plan_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="text_count"):
        plan_batches(-1, {1: 1.0})
    with pytest.raises(ValueError, match="no compiled batch sizes"):
        plan_batches(1, {})
    with pytest.raises(ValueError, match="costs > 0"):
        plan_batches(1, {1: 0.0})
