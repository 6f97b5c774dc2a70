"""The server's pure modules: settings, batching plans, NeuronCore placement, predictions, EMF."""

from __future__ import annotations

import io
import json
import math
import threading
import time
from pathlib import Path

import pytest

from intent_server.batching import BatchCall, call_costs, plan_batches
from intent_server.invocation import InvocationError, Limits, media_type, parse_invocation
from intent_server.metrics import EmfWriter, invocation_documents
from intent_server.placement import (
    PlacementError,
    ReplicaPool,
    ReplicaTimeout,
    load_order,
    parse_visible_cores,
    plan_cores,
)
from intent_server.predictions import predict, softmax
from intent_server.settings import SettingsError, load_settings
from intents import INTENT_LABELS
from neuron.targets import CompileTarget

# --- settings ---------------------------------------------------------------------------------


def test_defaults_follow_the_sagemaker_contract() -> None:
    settings = load_settings({})
    assert settings.model_dir == Path("/opt/ml/model")
    assert (settings.host, settings.port) == ("0.0.0.0", 8080)
    assert settings.image_target is None
    assert settings.model_copies is None
    assert (settings.metrics_endpoint_name, settings.metrics_variant_name) == ("local", "local")


def test_settings_are_read_from_the_environment() -> None:
    settings = load_settings({"SAGEMAKER_BIND_TO_PORT": "9090", "INTENT_TARGET": "inf1",
                              "INTENT_MODEL_COPIES": "2", "INTENT_VERIFY_CHECKSUMS": "no",
                              "INTENT_METRICS_ENDPOINT_NAME": "intent-prod",
                              "INTENT_METRICS_VARIANT_NAME": "AllTraffic",
                              "INTENT_REPLICA_WAIT_S": "2.5"})
    assert settings.port == 9090
    assert settings.image_target is CompileTarget.INF1
    assert settings.model_copies == 2
    assert settings.verify_checksums is False
    assert settings.metrics_endpoint_name == "intent-prod"
    assert settings.replica_wait_s == 2.5


@pytest.mark.parametrize(("env", "message"), [
    ({"SAGEMAKER_BIND_TO_PORT": "eighty"}, "SAGEMAKER_BIND_TO_PORT='eighty' is not an integer"),
    ({"SAGEMAKER_BIND_TO_PORT": "70000"}, "accepted: 1..65535"),
    ({"INTENT_TARGET": "gpu"}, "INTENT_TARGET: unknown target 'gpu'"),
    ({"INTENT_MODEL_COPIES": "0"}, "INTENT_MODEL_COPIES=0"),
    ({"INTENT_VERIFY_CHECKSUMS": "maybe"}, "not a boolean"),
    ({"INTENT_REPLICA_WAIT_S": "120"}, "INTENT_REPLICA_WAIT_S=120.0 is out of range"),
    ({"INTENT_METRICS_ENDPOINT_NAME": "bad\nname"}, "INTENT_METRICS_ENDPOINT_NAME"),
])
def test_bad_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(".", r"\.")):
        load_settings(env)


# --- request parsing ----------------------------------------------------------------------------

LIMITS = Limits(max_body_bytes=1000, max_text_chars=50, max_batch_texts=3)


def test_media_type_normalizes_and_defaults_to_json() -> None:
    assert media_type("Application/JSON; charset=UTF-8") == "application/json"
    assert media_type(None) == "application/json"
    parsed = parse_invocation(b'{"text": "hi"}', None, LIMITS)
    assert parsed.texts == ("hi",)
    assert not parsed.batch


def test_batch_and_limits() -> None:
    assert parse_invocation(b'{"texts": ["a", "b"]}', "application/json", LIMITS).batch
    with pytest.raises(InvocationError) as too_many:
        parse_invocation(b'{"texts": ["a", "b", "c", "d"]}', "application/json", LIMITS)
    assert too_many.value.status == 413
    assert "limit is 3" in too_many.value.message
    with pytest.raises(InvocationError) as too_big:
        parse_invocation(b"x" * 1001, "text/plain", LIMITS)
    assert too_big.value.status == 413


# --- batching -------------------------------------------------------------------------------------


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


# --- NeuronCore placement ------------------------------------------------------------------------


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


# --- predictions and metrics ------------------------------------------------------------------------


def test_softmax_is_stable_and_predict_picks_the_top_label() -> None:
    probabilities = softmax([1000.0, 1000.0, -1000.0])
    assert probabilities[:2] == [0.5, 0.5]
    assert probabilities[2] == 0.0
    logits = [0.0] * 8
    logits[3] = 2.0
    prediction = predict(logits, INTENT_LABELS, truncated=True, tokens=128)
    assert prediction.intent == "order_tracking"
    assert math.isclose(sum(prediction.scores.values()), 1.0)
    body = prediction.to_json(max_seq_length=128)
    assert body["truncated"] is True
    assert "first 128" in body["note"]
    with pytest.raises(ValueError, match="1 logits for 8 labels"):
        predict([1.0], INTENT_LABELS, truncated=False, tokens=3)
    with pytest.raises(ValueError, match="non-finite"):
        softmax([math.nan])


def test_emf_documents_use_the_contract_dimensions() -> None:
    documents = invocation_documents(endpoint_name="intent-prod", variant_name="AllTraffic",
                                     latency_ms=7.5, intents=["faq", "chitchat", "faq"],
                                     truncations=1, timestamp_ms=1_700_000_000_000,
                                     target="inf1")
    assert len(documents) == 3
    head = documents[0]
    assert (head["IntentLatency"], head["IntentTruncations"], head["Texts"]) == (7.5, 1.0, 3)
    assert {d["Intent"]: d["IntentPredictions"] for d in documents[1:]} == {
        "chitchat": 1.0, "faq": 2.0}
    stream = io.StringIO()
    EmfWriter(stream).write(documents)
    assert [json.loads(line) for line in stream.getvalue().splitlines()] == documents
    silent = io.StringIO()
    EmfWriter(silent, enabled=False).write(documents)
    assert silent.getvalue() == ""
