"""Hostile input: schemathesis generates valid and invalid requests from the served OpenAPI
schema and sends them over a real socket. No 5xx, every status documented, every JSON answer
matching its documented schema, and negative (schema-violating) bodies rejected with a 4xx."""

from __future__ import annotations

import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.containers.llm.harness import GatewayProcess

MIN_CASES = 500


def test_no_server_error_for_any_generated_request(gateway: GatewayProcess) -> None:
    schema = schemathesis.openapi.from_url(f"{gateway.url}/openapi.json")
    operations = [schema["/invocations"]["POST"], schema["/v1/chat/completions"]["POST"],
                  schema["/ping"]["GET"], schema["/v1/models"]["GET"]]
    strategies = [operation.as_strategy(generation_mode=mode)
                  for operation in operations
                  for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
                  if not (mode is GenerationMode.NEGATIVE and operation.method.upper() == "GET")]
    session = requests.Session()
    statuses: dict[int, int] = {}
    cases = 0

    @settings(max_examples=MIN_CASES + 100, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=st.one_of(*strategies))
    def check(case: schemathesis.Case) -> None:
        nonlocal cases
        cases += 1
        response = case.call(base_url=gateway.url, session=session, timeout=30)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
        case.validate_response(response, checks=[
            not_a_server_error, status_code_conformance, content_type_conformance,
            response_schema_conformance, negative_data_rejection,
        ])

    check()
    print(f"{cases} cases; statuses {sorted(statuses.items())}")
    assert cases >= MIN_CASES
    assert statuses.get(200, 0) >= 5, statuses  # valid requests were really served (≈5 %)
    assert sum(count for status, count in statuses.items() if 400 <= status < 500) > 20, statuses
    assert gateway.process.poll() is None
    assert gateway.ping().status_code == 200
