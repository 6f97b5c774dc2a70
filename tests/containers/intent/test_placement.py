"""intent_server.placement: NeuronCores per copy, operator overrides, and the replica pool."""

from __future__ import annotations

import threading
import time

import pytest

from intent_server.placement import (
    PlacementError,
    ReplicaPool,
    ReplicaTimeout,
    load_order,
    parse_visible_cores,
    plan_cores,
)
from neuron.targets import CompileTarget


def test_visible_core_lists() -> None:
    assert parse_visible_cores("0-3") == [0, 1, 2, 3]
    assert parse_visible_cores("0,2") == [0, 2]
    assert parse_visible_cores("1-2,5") == [1, 2, 5]
    for bad in ("a-b", "3-1", ",", ""):
        with pytest.raises(PlacementError):
            parse_visible_cores(bad)


def test_inf1_xlarge_gets_one_copy_per_core_by_default() -> None:
    plan = plan_cores(CompileTarget.INF1, {}, device_count=1, pipeline_cores=1,
                      requested_copies=None)
    assert (plan.copies, plan.cores_available) == (4, 4)
    assert plan.env_updates == {"NEURON_RT_NUM_CORES": "4"}


def test_pipelined_model_takes_several_cores_per_copy() -> None:
    plan = plan_cores(CompileTarget.INF1, {}, device_count=1, pipeline_cores=2,
                      requested_copies=None)
    assert plan.copies == 2
    assert plan.env_updates == {"NEURON_RT_NUM_CORES": "4"}
    with pytest.raises(PlacementError, match="cannot hold one copy"):
        plan_cores(CompileTarget.INF1, {"NEURON_RT_NUM_CORES": "1"}, device_count=1,
                   pipeline_cores=2, requested_copies=None)


def test_operator_settings_win_and_are_not_overwritten() -> None:
    visible = plan_cores(CompileTarget.INF1, {"NEURON_RT_VISIBLE_CORES": "1-2"},
                         device_count=4, pipeline_cores=1, requested_copies=None)
    assert visible.copies == 2
    assert visible.env_updates == {}
    counted = plan_cores(CompileTarget.INF2, {"NEURON_RT_NUM_CORES": "1"}, device_count=1,
                         pipeline_cores=1, requested_copies=None)
    assert counted.copies == 1
    assert counted.env_updates == {}
    fewer = plan_cores(CompileTarget.INF1, {}, device_count=1, pipeline_cores=1,
                       requested_copies=2)
    assert fewer.copies == 2
    assert fewer.env_updates == {"NEURON_RT_NUM_CORES": "2"}


def test_inf2_xlarge_has_two_cores() -> None:
    plan = plan_cores(CompileTarget.INF2, {}, device_count=1, pipeline_cores=1,
                      requested_copies=None)
    assert plan.copies == 2


@pytest.mark.parametrize(("env", "devices", "copies", "message"), [
    ({}, 0, None, "no NeuronCore visible"),
    ({}, 1, 5, "room for at most 4"),
    ({"NEURON_RT_NUM_CORES": "four"}, 1, None, "not an integer"),
    ({"NEURON_RT_NUM_CORES": "0"}, 1, None, "at least 1"),
])
def test_impossible_placements_are_explained(env: dict[str, str], devices: int,
                                             copies: int | None, message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        plan_cores(CompileTarget.INF1, env, device_count=devices, pipeline_cores=1,
                   requested_copies=copies)


def test_cpu_runs_one_copy_unless_asked() -> None:
    assert plan_cores(CompileTarget.CPU, {}, device_count=0, pipeline_cores=1,
                      requested_copies=None).copies == 1
    assert plan_cores(CompileTarget.CPU, {}, device_count=0, pipeline_cores=1,
                      requested_copies=3).copies == 3


def test_load_order_lands_each_copy_on_its_own_core() -> None:
    # Default placement: each load goes to the least-used core. Loading every copy of batch 1,
    # then every copy of batch 8, puts copy i's two models on core i.
    order = load_order((1, 8), 4)
    assert order == [(0, 1), (1, 1), (2, 1), (3, 1), (0, 8), (1, 8), (2, 8), (3, 8)]
    core_of: dict[tuple[int, int], int] = {}
    loads_per_core = [0, 0, 0, 0]
    for copy, size in order:
        core = loads_per_core.index(min(loads_per_core))
        loads_per_core[core] += 1
        core_of[(copy, size)] = core
    assert all(core_of[(c, 1)] == core_of[(c, 8)] == c for c in range(4))


def test_replica_pool_lends_each_copy_to_one_thread_at_a_time() -> None:
    pool = ReplicaPool(["copy-a", "copy-b"])
    in_use: set[str] = set()
    clashes: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        with pool.checkout(timeout_s=5) as replica:
            with lock:
                if replica in in_use:
                    clashes.append(replica)
                in_use.add(replica)
            time.sleep(0.01)
            with lock:
                in_use.discard(replica)

    threads = [threading.Thread(target=work) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert clashes == []
    assert pool.busy == 0
    with pool.checkout(1), pool.checkout(1), pytest.raises(ReplicaTimeout, match="2 model"), \
            pool.checkout(0.05):
        pass
