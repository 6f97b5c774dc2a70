"""The real `serve` process over HTTP: /ping, single and batch classification, hostile input,
concurrency and the EMF lines on stdout."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from intents import INTENT_LABELS
from neuron.samples import LONG_QUERY, parity_texts

JSON = {"content-type": "application/json"}


def classify(base_url: str, payload: Any) -> httpx.Response:
    return httpx.post(f"{base_url}/invocations", json=payload, timeout=30)


def test_ping_reports_ready_with_the_model(served: Any) -> None:
    response = httpx.get(f"{served.base_url}/ping", timeout=2)
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "target": "cpu", "copies": 1,
                               "batch_sizes": [1, 4]}


def _check_prediction(prediction: dict[str, Any]) -> None:
    assert prediction["intent"] in INTENT_LABELS
    assert list(prediction["scores"]) == list(INTENT_LABELS)
    assert math.isclose(sum(prediction["scores"].values()), 1.0, abs_tol=1e-4)
    assert prediction["confidence"] == max(prediction["scores"].values())
    assert prediction["scores"][prediction["intent"]] == prediction["confidence"]


def test_single_text(served: Any) -> None:
    response = classify(served.base_url, {"text": "What manga is similar to Attack on Titan?"})
    assert response.status_code == 200
    body = response.json()
    _check_prediction(body)
    assert body["truncated"] is False
    assert "note" not in body


def test_plain_text_body_and_japanese(served: Any) -> None:
    response = httpx.post(f"{served.base_url}/invocations", timeout=30,
                          content="鬼滅の刃に似たマンガを教えて".encode(),
                          headers={"content-type": "text/plain; charset=utf-8"})
    assert response.status_code == 200
    _check_prediction(response.json())


@pytest.mark.parametrize("count", [1, 3, 4, 9])
def test_batch_answers_in_order_and_equals_single_requests(served: Any, count: int) -> None:
    texts = parity_texts()[:count]
    response = classify(served.base_url, {"texts": texts})
    assert response.status_code == 200
    predictions = response.json()["predictions"]
    assert len(predictions) == count
    for text, prediction in zip(texts, predictions, strict=True):
        _check_prediction(prediction)
        single = classify(served.base_url, {"text": text}).json()
        # Padded batch-of-4 calls and batch-of-1 calls must agree on every score.
        assert single["intent"] == prediction["intent"]
        for label in INTENT_LABELS:
            assert single["scores"][label] == pytest.approx(prediction["scores"][label],
                                                            abs=1e-5)


def test_long_input_is_truncated_and_says_so(served: Any) -> None:
    body = classify(served.base_url, {"text": LONG_QUERY}).json()
    _check_prediction(body)
    assert body["truncated"] is True
    assert "128 tokens" in body["note"]


DEEP_JSON = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(("content", "content_type", "status", "fragment"), [
    (b"{not json", "application/json", 400, "not valid JSON"),
    (b"", "application/json", 400, "empty"),
    (b"[\"a text\"]", "application/json", 400, "got an array"),
    (b"null", "application/json", 400, "got null"),
    (b'{"text": 5}', "application/json", 400, "text: expected a string, got a number"),
    (b'{"text": null}', "application/json", 400, "text: expected a string, got null"),
    (b'{"text": ""}', "application/json", 400, "text: is empty"),
    (b'{"text": " \\n\\t "}', "application/json", 400, "text: is empty"),
    (b'{"texts": []}', "application/json", 400, "texts: is empty"),
    (b'{"texts": "one"}', "application/json", 400, "texts: expected a list"),
    (b'{"texts": ["ok", 3]}', "application/json", 400, "texts[1]: expected a string"),
    (b'{"texts": ["ok", ""]}', "application/json", 400, "texts[1]: is empty"),
    (b'{"text": "a", "texts": ["b"]}', "application/json", 400, "exactly one of"),
    (b'{"inputs": "a"}', "application/json", 400, "unknown field(s) ['inputs']"),
    (b'{}', "application/json", 400, "exactly one of"),
    (DEEP_JSON.encode(), "application/json", 400, "not valid JSON"),
    (b'{"text": "\xff\xfe"}', "application/json", 400, "not valid UTF-8"),
    (b"   ", "text/plain", 400, "body: is empty"),
    (b"<text>hi</text>", "application/xml", 415, "application/xml"),
    (b"hi", "text/plain; charset=latin-1", 415, "charset"),
    (json.dumps({"texts": ["a"] * 65}).encode(), "application/json", 413, "limit is 64"),
    (json.dumps({"text": "x" * 10_001}).encode(), "application/json", 413, "limit is 10000"),
    (b"x" * (1 << 20 + 1), "text/plain", 413, "bytes; the limit is 1048576"),
])
def test_hostile_input_gets_a_4xx_naming_the_problem(served: Any, content: bytes,
                                                     content_type: str, status: int,
                                                     fragment: str) -> None:
    response = httpx.post(f"{served.base_url}/invocations", content=content, timeout=30,
                          headers={"content-type": content_type})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["status"] == status
    assert fragment in error["message"]


def test_chunked_oversized_body_is_refused(served: Any) -> None:
    def chunks() -> Any:
        for _ in range(20):
            yield b"y" * 65536  # 1.25 MiB without a Content-Length header

    response = httpx.post(f"{served.base_url}/invocations", content=chunks(), timeout=30,
                          headers={"content-type": "text/plain"})
    assert response.status_code == 413


def test_wrong_method_and_path(served: Any) -> None:
    assert httpx.get(f"{served.base_url}/invocations", timeout=5).status_code == 405
    assert httpx.get(f"{served.base_url}/docs", timeout=5).status_code == 404


def test_concurrent_requests_all_succeed_and_ping_stays_up(served: Any) -> None:
    texts = parity_texts()

    def one(index: int) -> int:
        payload = {"texts": texts[index % 5: index % 5 + 1 + index % 4]}
        return classify(served.base_url, payload).status_code

    with ThreadPoolExecutor(max_workers=12) as pool:
        statuses = list(pool.map(one, range(36)))
        ping = httpx.get(f"{served.base_url}/ping", timeout=2)
    assert statuses == [200] * 36
    assert ping.status_code == 200


def test_emf_lines_follow_the_metrics_contract(served: Any) -> None:
    classify(served.base_url, {"texts": ["hello there", LONG_QUERY]})
    documents = [json.loads(line) for line in served.emf_lines()]
    assert documents, "the server wrote no EMF lines to stdout"
    latency_docs = [d for d in documents if "IntentLatency" in d]
    prediction_docs = [d for d in documents if "IntentPredictions" in d]
    assert latency_docs
    assert prediction_docs
    for document in documents:
        assert document["EndpointName"] == "intent-test"
        assert document["VariantName"] == "AllTraffic"
        (directive,) = document["_aws"]["CloudWatchMetrics"]
        assert directive["Namespace"] == "MangaAssist/Inference"
    last = latency_docs[-1]
    assert last["Texts"] == 2
    assert last["IntentTruncations"] == 1.0
    assert last["IntentLatency"] > 0
    assert last["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["EndpointName",
                                                                    "VariantName"]]
    for document in prediction_docs:
        assert document["Intent"] in INTENT_LABELS
        assert document["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [
            ["EndpointName", "VariantName", "Intent"]]
    # Every classified text is counted once under its intent.
    latency_texts = sum(d["Texts"] for d in latency_docs)
    assert sum(d["IntentPredictions"] for d in prediction_docs) == latency_texts
