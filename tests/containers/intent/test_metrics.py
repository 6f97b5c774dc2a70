"""intent_server.metrics: the EMF documents of one invocation, and the writer that prints them."""

from __future__ import annotations

import io
import json

from intent_server.metrics import EmfWriter, invocation_documents


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
