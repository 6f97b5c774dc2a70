"""Warmup sends the production system prompt (prefix cache, the AWQ calibration prompt)."""

from __future__ import annotations

import json
from typing import Any

from gateway.demo_model import SYSTEM_PROMPT_EN
from gateway.warmup import warmup_requests
from quantization.system_prompt import MANGAASSIST_SYSTEM_PROMPT


def system_prompts(runtime: Any) -> set[str]:
    return {body["messages"][0]["content"] for _, body in warmup_requests(runtime)
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
