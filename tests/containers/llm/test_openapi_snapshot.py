"""The published ``/openapi.json`` is the HTTP contract: the document an in-process gateway (the
default settings on the demo model) serves is byte-for-byte the one recorded before the HTTP
layer moved into ``gateway.api`` (issue 41). A change to the contract updates the fixture in the
same commit, on purpose: ``MANGAASSIST_WRITE_OPENAPI=1`` rewrites it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "openapi.json"


def served_openapi(make_runtime: Any) -> bytes:
    """The bytes of GET /openapi.json (the lifespan is not entered: no engine starts)."""
    runtime, _ = make_runtime()
    response = TestClient(runtime.app).get("/openapi.json")
    assert response.status_code == 200
    return response.content


def test_openapi_json_is_unchanged(make_runtime: Any) -> None:
    served = served_openapi(make_runtime)
    if os.environ.get("MANGAASSIST_WRITE_OPENAPI") == "1":
        FIXTURE.write_bytes(served)
    assert served == FIXTURE.read_bytes(), (
        "/openapi.json changed; if on purpose, MANGAASSIST_WRITE_OPENAPI=1 rewrites the fixture")
