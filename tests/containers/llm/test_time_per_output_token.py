"""The gateway measures the stream's pace per request: ``TimePerOutputToken`` on a real socket.

The simulated engine takes ``SIM_STEP_TIME_S`` per engine step and emits one token per
running sequence per step, so a request's time per output token is that step time (plus the
event loop's scheduling): the metric the LLM endpoint's paging and rollback alarm watches.
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.containers.llm.harness import GatewayProcess
from tests.containers.llm.test_telemetry import assert_valid_emf


def test_streamed_and_plain_requests_report_their_time_per_output_token(
        start_gateway: Any) -> None:
    gateway: GatewayProcess = start_gateway({
        "SIM_STEP_TIME_S": "0.02", "SIM_EOS_PROBABILITY": "0",
    })
    gateway.wait_ready()
    body = {"messages": [{"role": "user", "content": "Recommend a long manga, please."}],
            "max_tokens": 30}
    plain = httpx.post(f"{gateway.url}/invocations", json=body, timeout=30.0)
    assert plain.status_code == 200
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions",
                      json={**body, "stream": True}, timeout=30.0) as streamed:
        assert streamed.status_code == 200
        assert "data: [DONE]" in streamed.read().decode()
    lines = [doc for doc in gateway.emf()
             if doc.get("event") == "request" and not doc.get("warmup")
             and "TimePerOutputToken" in doc]
    assert len(lines) == 2, lines
    for document in lines:
        assert_valid_emf(document)
        assert document["CompletionTokens"] == 30.0
        # 29 tokens after the first, one 20 ms engine step each (never faster than the step)
        assert 19.0 <= document["TimePerOutputToken"] < 60.0
        assert document["tpot_ms"] == round(document["TimePerOutputToken"], 3)
        # Seed 001's first response: the first token for the stream, the whole answer otherwise
        # (docs/design-decisions.md#p999-first-response)
        mode = "streamed" if document["stream"] else "whole"
        directive = next(d for d in document["_aws"]["CloudWatchMetrics"]
                         if d["Metrics"] == [{"Name": "FirstResponseLatency",
                                              "Unit": "Milliseconds"}])
        assert directive["Dimensions"] == [["EndpointName", "VariantName", "Mode"]]
        assert document["Mode"] == mode
        if document["stream"]:
            # 29 more 20 ms steps came after the first token: at least 0.5 s before the end
            assert (document["FirstResponseLatency"]
                    <= document["RequestLatency"] - 29 * 19.0)
            assert document["FirstResponseLatency"] >= document["TimeToFirstToken"]
        else:
            assert document["FirstResponseLatency"] == document["RequestLatency"]
