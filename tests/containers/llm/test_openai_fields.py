"""The compatibility table (gateway/api/openai_fields.py) against what it describes: OpenAI's request
type in the openai SDK, the gateway's schema, the docs and the simulated engine (vLLM's own
request class is checked in test_vllm_contract.py, for both builds)."""

from __future__ import annotations

import typing
from pathlib import Path

from openai.types.chat import completion_create_params

from gateway.api.openai_fields import (
    ACCEPTED,
    BY_NAME,
    FIELDS,
    REFUSED,
    SAMPLING_FIELDS,
    compatibility_markdown,
)
from gateway.api.protocol import ChatCompletionRequest
from tests.support.sim_engine import SIM_FIELD_SUPPORT

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_every_openai_request_field_has_a_row() -> None:
    openai_fields = set(typing.get_type_hints(
        completion_create_params.CompletionCreateParamsBase)) | {"stream"}
    assert openai_fields - set(BY_NAME) == set(), "rows missing in gateway/api/openai_fields.py"
    assert len(FIELDS) == len(BY_NAME), "a field has two rows"


def test_the_schema_takes_exactly_the_accepted_fields() -> None:
    schema_fields = set(ChatCompletionRequest.model_fields)
    assert schema_fields == ACCEPTED
    assert not set(REFUSED) & schema_fields
    assert set(SAMPLING_FIELDS) <= ACCEPTED
    assert all(field.note for field in FIELDS if field.status == "refused")


def test_the_gateway_guide_shows_the_table() -> None:
    guide = (REPO_ROOT / "docs" / "gateway.md").read_text(encoding="utf-8")
    assert compatibility_markdown() in guide


def test_the_simulator_says_what_it_does_with_every_sampling_field() -> None:
    assert set(SAMPLING_FIELDS) == set(SIM_FIELD_SUPPORT)
