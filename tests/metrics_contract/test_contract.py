"""metrics_contract on its own: every metric named once, looked up by name and namespace, and the
EMF document that refuses anything the contract does not declare.

Its readers are tested where they read it (the gateway's and the classifier's EMF lines, the
Lambdas' metric lines, alarms, dashboard, request buckets); these tests pin the contract's own
rules, so a change to them fails here first.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

import metrics_contract as mc

DIMS = {"EndpointName": "mangaassist-llm-prod", "VariantName": "AllTraffic"}


def test_every_metric_in_the_module_is_in_the_contract_once() -> None:
    declared = [v for v in vars(mc).values() if isinstance(v, mc.MetricSpec)]
    assert list(mc.ALL_METRICS) == declared
    keys = [(spec.namespace, spec.name) for spec in mc.ALL_METRICS]
    assert len(set(keys)) == len(keys)


def test_lookup_is_by_namespace_and_name() -> None:
    assert mc.metric("Requests") is mc.REQUESTS
    assert mc.metric("Invocations", mc.SAGEMAKER_NAMESPACE) is mc.SM_INVOCATIONS
    with pytest.raises(KeyError, match=r"'Invocations' is not in the contract for namespace "
                                       r"'MangaAssist/Inference'; known: .*Requests"):
        mc.metric("Invocations")


def test_only_our_emitters_make_custom_metrics() -> None:
    assert mc.REQUESTS.is_custom and mc.CALENDAR_ACTIONS_CREATED.is_custom
    assert not mc.SM_INVOCATIONS.is_custom
    assert not mc.LAMBDA_ERRORS.is_custom
    assert all(spec.namespace == mc.NAMESPACE for spec in mc.ALL_METRICS if spec.is_custom)


def test_closed_dimensions_declare_their_values_and_open_ones_do_not() -> None:
    assert mc.ADMISSION_REJECTIONS.values_of("Bucket") == ("S", "M", "L", "XL", "Unsized")
    assert mc.ADMISSION_REJECTIONS.values_of("EndpointName") is None
    for spec in mc.ALL_METRICS:
        for dimension, _ in spec.dimension_values:
            assert dimension in spec.dimensions, (spec.name, dimension)


def test_breaker_states_have_distinct_values() -> None:
    assert sorted(mc.BREAKER_STATE_VALUES.values()) == [0, 1, 2]


def test_emf_document_declares_each_metric_with_its_unit_and_dimensions() -> None:
    document = mc.emf_document({mc.REQUESTS: 1, mc.REQUEST_LATENCY: 12.5}, DIMS,
                               timestamp_ms=1_700_000_000_123,
                               properties={"request_id": "r-1"})
    assert document["_aws"] == {
        "Timestamp": 1_700_000_000_123,
        "CloudWatchMetrics": [{
            "Namespace": "MangaAssist/Inference",
            "Dimensions": [["EndpointName", "VariantName"]],
            "Metrics": [{"Name": "Requests", "Unit": "Count"},
                        {"Name": "RequestLatency", "Unit": "Milliseconds"}]}]}
    assert (document["Requests"], document["RequestLatency"]) == (1.0, 12.5)
    assert isinstance(document["Requests"], float)
    assert document["EndpointName"] == "mangaassist-llm-prod"
    assert document["request_id"] == "r-1"


def test_a_lambda_metric_goes_out_with_its_own_dimension_set() -> None:
    document = mc.emf_document({mc.CALENDAR_ACTIONS_CREATED: 6}, {"Environment": "dev"},
                               timestamp_ms=0)
    assert document["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Environment"]]


@pytest.mark.parametrize(("values", "dimensions", "message"), [
    ({}, DIMS, "no metric values given"),
    ({mc.SM_INVOCATIONS: 1, mc.REQUESTS: 1}, DIMS, "metrics span namespaces"),
    ({mc.SM_INVOCATIONS: 1}, DIMS, "'Invocations' is not a custom metric of the contract"),
    ({dataclasses.replace(mc.REQUESTS, description="a look-alike"): 1}, DIMS,
     "'Requests' is not a custom metric of the contract"),
    ({mc.REQUESTS: 1}, {"EndpointName": "e"},
     r"Requests is published with dimensions \['EndpointName', 'VariantName'\], got "
     r"\['EndpointName'\]"),
    ({mc.ADMISSION_REJECTIONS: 1}, {**DIMS, "Bucket": "XXL"},
     "Bucket='XXL' is not accepted; accepted: S, M, L, XL"),
    ({mc.REQUESTS: math.nan}, DIMS, "Requests value nan is not a finite number"),
    ({mc.REQUESTS: math.inf}, DIMS, "Requests value inf is not a finite number"),
])
def test_emf_document_refuses_what_the_contract_does_not_declare(
        values: dict[mc.MetricSpec, float], dimensions: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mc.emf_document(values, dimensions, timestamp_ms=0)


def test_one_document_carries_groups_on_their_own_dimension_sets() -> None:
    """A rejected request's line: the rejection on its Bucket, the first response on its Mode,
    one metric directive each, sharing the document's root."""
    document = mc.emf_document(
        {mc.ADMISSION_REJECTIONS: 1}, {**DIMS, "Bucket": "S"}, timestamp_ms=5,
        properties={"event": "request"},
        also=[({mc.FIRST_RESPONSE_LATENCY: 8.5}, {**DIMS, "Mode": "streamed"})])
    assert document["_aws"]["CloudWatchMetrics"] == [
        {"Namespace": "MangaAssist/Inference",
         "Dimensions": [["EndpointName", "VariantName", "Bucket"]],
         "Metrics": [{"Name": "AdmissionRejections", "Unit": "Count"}]},
        {"Namespace": "MangaAssist/Inference",
         "Dimensions": [["EndpointName", "VariantName", "Mode"]],
         "Metrics": [{"Name": "FirstResponseLatency", "Unit": "Milliseconds"}]}]
    assert (document["Bucket"], document["Mode"], document["FirstResponseLatency"]) == (
        "S", "streamed", 8.5)
    assert document["event"] == "request"


@pytest.mark.parametrize(("also", "message"), [
    ([({mc.FIRST_RESPONSE_LATENCY: 1}, {**DIMS, "Mode": "partial"})],
     "Mode='partial' is not accepted; accepted: streamed, whole"),
    ([({mc.FIRST_RESPONSE_LATENCY: 1}, DIMS)], "published with dimensions"),
    ([({mc.FIRST_RESPONSE_LATENCY: 1},
       {"EndpointName": "other", "VariantName": "AllTraffic", "Mode": "whole"})],
     "dimension EndpointName is 'mangaassist-llm-prod' in one group and 'other' in another"),
    ([({mc.REQUESTS: 2}, DIMS)], r"\['Requests'\] given in two groups"),
])
def test_groups_are_checked_like_the_first(also: list[mc.MetricGroup], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mc.emf_document({mc.REQUESTS: 1}, DIMS, timestamp_ms=0, also=also)
