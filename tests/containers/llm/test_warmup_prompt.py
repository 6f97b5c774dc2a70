"""Warmup sends the production system prompt (prefix cache, the AWQ calibration prompt)."""

from __future__ import annotations

import json
from typing import Any

from gateway.warmup import salted, warmup_requests
from prompts import MANGAASSIST_SYSTEM_PROMPT, SYSTEM_PROMPT_EN


def system_prompts(runtime: Any) -> set[str]:
    requests = warmup_requests(runtime.settings, served_names=runtime.router.served_names(),
                               count=lambda text: runtime.tokenizer.count([text])[0],
                               log=runtime.telemetry.log)
    return {body["messages"][0]["content"] for _, body in requests
            if body["messages"][0]["role"] == "system"}


def test_warmup_uses_the_production_system_prompt(make_runtime: Any) -> None:
    runtime, lines = make_runtime()
    assert system_prompts(runtime) == {MANGAASSIST_SYSTEM_PROMPT}
    assert not [line for line in lines if "warmup_system_prompt_over_budget" in line]


def test_a_system_prompt_over_budget_is_reported_and_warmup_still_runs(make_runtime: Any) -> None:
    runtime, lines = make_runtime(ENGINE_MAX_MODEL_LEN="1024")
    assert system_prompts(runtime) == {SYSTEM_PROMPT_EN}
    (warning,) = [json.loads(line) for line in lines if "warmup_system_prompt_over_budget" in line]
    assert warning["level"] == "warning"
    assert warning["system_prompt_tokens"] > warning["system_budget_tokens"] == 128


def test_warmup_that_never_succeeds_turns_ping_red_after_its_time_bound(
    make_runtime: Any, monkeypatch: Any,
) -> None:
    import asyncio

    import gateway.lifecycle

    async def never(*args: Any, **kwargs: Any) -> bool:
        return False

    monkeypatch.setattr(gateway.lifecycle, "run_warmup", never)
    runtime, lines = make_runtime(GATEWAY_WARMUP_TIMEOUT_S="1")

    async def scenario() -> None:
        await runtime.lifecycle.startup(runtime.app)
        await runtime.supervisor.close()

    asyncio.run(scenario())
    response = runtime.ping()
    body = json.loads(response.body)
    assert response.status_code == 503
    assert body["status"] == "failed"
    assert "GATEWAY_WARMUP_TIMEOUT_S=1 s" in body["reason"]
    assert [json.loads(line) for line in lines if '"fatal"' in line]


def test_a_salted_pass_begins_every_message_but_the_system_prompt_with_its_salt(
        make_runtime: Any) -> None:
    """Whichever turns the sliding window keeps, the prompt after the system prompt begins with
    the pass's salt (tests/containers/llm/test_cold_start.py shows the prefix cache it avoids);
    the set it salts is left as it was, for the next pass."""
    runtime, _ = make_runtime()
    requests = warmup_requests(runtime.settings, served_names=runtime.router.served_names(),
                               count=lambda text: runtime.tokenizer.count([text])[0],
                               log=runtime.telemetry.log)
    before = json.dumps(requests)
    for (label, body), (salted_label, salted_body) in zip(
            requests, salted(requests, "#2 "), strict=True):
        assert salted_label == label
        assert {key: value for key, value in salted_body.items() if key != "messages"} == {
            key: value for key, value in body.items() if key != "messages"}
        for message, salted_message in zip(body["messages"], salted_body["messages"],
                                           strict=True):
            expected = (message["content"] if message["role"] == "system"
                        else "#2 " + message["content"])
            assert salted_message == {**message, "content": expected}
    assert json.dumps(requests) == before
