"""What every 4xx body of the gateway must be: OpenAI's error object, a public ``param``, a
non-null ``code``, a sentence without validator internals, a bounded size."""

from __future__ import annotations

import re
from typing import Any

PUBLIC_PARAM = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\[\d+\]|\.[A-Za-z_][A-Za-z0-9_-]*)*$")
"""A public field path: ``messages[0].role``, ``mangaassist.pinned_messages[2]``, ``stop``."""
MAX_ERROR_BODY = 2_000
LEAKS = ("0x", "function-after", "function-before", "functools", "<function", "Value error",
         "[type=", "pydantic", "Traceback")
"""What pydantic's and Python's internals look like in a message."""


def _texts(value: Any) -> list[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in (*_texts(key), *_texts(item))]
    if isinstance(value, (list, tuple)):
        return [text for item in value for text in _texts(item)]
    return []


def error_shape_problems(response: Any, sent: Any = None) -> list[str]:
    """What is wrong with a 4xx's body: OpenAI's shape, a sentence, a public ``param`` (or none),
    a non-null code, no validator internals, a bounded size (``response``: requests', httpx' or
    schemathesis'). ``sent``: the request's JSON body; a message may quote the caller's own
    values ("got ['0x']", a fuzzer's string), which are not internals."""
    content_type = response.headers.get("content-type") or ""
    content_type = content_type[0] if isinstance(content_type, list) else content_type
    if not content_type.startswith("application/json"):
        return [f"content type {content_type!r}"]
    problems = [f"{len(response.content)}-byte body"] if len(response.content) > MAX_ERROR_BODY else []
    body = response.json()
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or set(body) != {"error"}:
        return [*problems, f"not an error object: {str(body)[:200]}"]
    if set(error) != {"message", "type", "param", "code"}:
        problems.append(f"keys {sorted(error)}")
    if not (isinstance(error.get("code"), str) and error["code"]):
        problems.append(f"code {error.get('code')!r}")
    if not (isinstance(error.get("message"), str) and error["message"]):
        problems.append("no message")
    param = error.get("param")
    if param is not None and not (isinstance(param, str) and PUBLIC_PARAM.match(param)):
        problems.append(f"param {str(param)[:120]!r}")
    quoted = _texts(sent)
    leaks = [leak for leak in LEAKS if leak in str(error.get("message"))
             and not any(leak in text for text in quoted)]
    if leaks:
        problems.append(f"message leaks {leaks}: {str(error.get('message'))[:200]!r}")
    return problems


def assert_error_shape(response: Any, sent: Any = None) -> dict[str, Any]:
    """The 4xx's error object, after checking it has no :func:`error_shape_problems` (``sent``:
    the request's JSON body)."""
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    problems = error_shape_problems(response, sent)
    assert not problems, (problems, response.text[:500])
    return dict(response.json()["error"])
