"""Post-deploy smoke test of both live endpoints through the SageMaker runtime (make smoke).

    python -m tools.smoke --env prod [--llm-endpoint NAME] [--intent-endpoint NAME]
                          [--endpoint-url http://127.0.0.1:8090] [--markdown FILE]

The LLM endpoint gets a Japanese and an English multi-turn conversation, a request routed by
intent + locale, a streamed request (InvokeEndpointWithResponseStream, every event parsed) and a
stateful session (opened with SessionId=NEW_SESSION, two turns on its instance, closed); the
intent endpoint gets a batch. Answers, routing, the fallback flag, latency and time to first
token are judged against ``smoke`` in config/<env>.yaml (tools/smoke_checks.py). Prints a table
and one line per failure; exit 0 when every check passed, 1 otherwise, 2 on bad arguments.
Endpoint names default to the ones the stacks create; ``--endpoint-url`` points botocore at
another runtime (the local stand-in, tests/support/runtime_standin.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from stacks.settings import CONFIG_DIR, EnvironmentSettings, SettingsError, load_settings
from tools.smoke_checks import (
    EN_CONVERSATION,
    JA_CONVERSATION,
    ROUTED_INTENT,
    ROUTED_LOCALE,
    SESSION_FOLLOW_UP,
    Check,
    SessionRecord,
    SseAssembler,
    StreamRecord,
    chat_body,
    expected_adapter,
    has_content,
    intent_body,
    judge_chat,
    judge_intent,
    judge_session,
    judge_stream,
    render_markdown,
    render_table,
    session_id_of,
)

Clock = Callable[[], float]


def _invoke(runtime: Any, endpoint: str, body: bytes, clock: Clock,
            session: str | None = None) -> tuple[bytes, float]:
    started = clock()
    extra = {"SessionId": session} if session is not None else {}
    response = runtime.invoke_endpoint(EndpointName=endpoint, Body=body,
                                       ContentType="application/json", Accept="application/json",
                                       **extra)
    raw = response["Body"].read()
    return raw, (clock() - started) * 1000


def _session_request(runtime: Any, endpoint: str, request_type: str, session: str) -> Any:
    return runtime.invoke_endpoint(EndpointName=endpoint, SessionId=session,
                                   Body=json.dumps({"requestType": request_type}).encode(),
                                   ContentType="application/json", Accept="application/json")


def open_session(runtime: Any, endpoint: str) -> tuple[str | None, str]:
    """Open a stateful session: (its id, the NewSessionId value as received)."""
    value = str(_session_request(runtime, endpoint, "NEW_SESSION", "NEW_SESSION")
                .get("NewSessionId") or "")
    return session_id_of(value), value


def _session(runtime: Any, endpoint: str, settings: EnvironmentSettings,
             clock: Clock) -> SessionRecord:
    """A session as a caller runs one: open it, two turns, close it. A turn refused on its
    session (its instance is gone) is sent again, once, on a new session: the history travels
    with every request, so nothing is lost."""
    from botocore.exceptions import BotoCoreError, ClientError

    record = SessionRecord()
    messages = list(EN_CONVERSATION)
    try:
        session, value = open_session(runtime, endpoint)
        record.opened.append(value)
        for _ in range(2):
            body = chat_body(messages, settings.smoke, extension={"locale": "en-US"})
            try:
                raw, ms = _invoke(runtime, endpoint, body, clock, session=session)
            except ClientError:
                session, value = open_session(runtime, endpoint)
                record.opened.append(value)
                raw, ms = _invoke(runtime, endpoint, body, clock, session=session)
            record.turns.append((raw, ms))
            answer = json.loads(raw)["choices"][0]["message"]["content"]
            messages += [{"role": "assistant", "content": answer},
                         {"role": "user", "content": SESSION_FOLLOW_UP}]
        if session is not None:
            closed = _session_request(runtime, endpoint, "CLOSE", session)
            record.closed = closed.get("ClosedSessionId")
    except (ClientError, BotoCoreError) as error:
        record.error = f"{type(error).__name__}: {error}"
    except (ValueError, KeyError, IndexError, TypeError) as error:
        record.error = f"not a chat completion: {type(error).__name__}: {error}"
    return record


def _stream(runtime: Any, endpoint: str, body: bytes, clock: Clock) -> StreamRecord:
    from botocore.exceptions import BotoCoreError, ClientError

    record = StreamRecord()
    assembler = SseAssembler()
    started = clock()
    try:
        response = runtime.invoke_endpoint_with_response_stream(
            EndpointName=endpoint, Body=body, ContentType="application/json",
            Accept="text/event-stream")
        for event in response["Body"]:
            if "PayloadPart" not in event:
                record.error = f"unexpected event {sorted(event)}"
                break
            for payload in assembler.feed(event["PayloadPart"]["Bytes"]):
                if record.first_content_ms is None and has_content(payload):
                    record.first_content_ms = (clock() - started) * 1000
    except (ClientError, BotoCoreError) as error:
        record.error = f"{type(error).__name__}: {error}"
    except UnicodeDecodeError as error:
        record.error = f"invalid UTF-8 in the stream: {error}"
    record.total_ms = (clock() - started) * 1000
    record.data, record.leftover = assembler.data, assembler.leftover
    return record


def run_checks(runtime: Any, settings: EnvironmentSettings, *, llm_endpoint: str,
               intent_endpoint: str, clock: Clock = time.perf_counter) -> list[Check]:
    """Every smoke check against the two endpoints; a failed call is a failed check."""
    from botocore.exceptions import BotoCoreError, ClientError

    smoke = settings.smoke
    adapter = expected_adapter(settings.llm, ROUTED_INTENT, ROUTED_LOCALE)
    checks: list[Check] = []
    chats = [
        ("conversation ja", JA_CONVERSATION, {"locale": "ja-JP"}, {}),
        ("conversation en", EN_CONVERSATION, {"locale": "en-US"}, {}),
        ("routed intent+locale", JA_CONVERSATION[-1:],
         {"intent": ROUTED_INTENT, "locale": ROUTED_LOCALE},
         {"adapter": adapter, "route": "intent+locale"}),
    ]
    for name, messages, extension, expect in chats:
        try:
            raw, ms = _invoke(runtime, llm_endpoint, chat_body(messages, smoke,
                                                                extension=extension), clock)
            checks.append(judge_chat(llm_endpoint, name, raw, ms, smoke, **expect))
        except (ClientError, BotoCoreError) as error:
            checks.append(Check(llm_endpoint, name, False, f"{type(error).__name__}: {error}"))
    record = _stream(runtime, llm_endpoint,
                     chat_body(EN_CONVERSATION, smoke, extension={"locale": "en-US"},
                               stream=True), clock)
    checks.append(judge_stream(llm_endpoint, record, smoke))
    checks.append(judge_session(llm_endpoint, _session(runtime, llm_endpoint, settings, clock),
                                smoke, block_size=settings.llm.block_size))
    try:
        raw, ms = _invoke(runtime, intent_endpoint, intent_body(), clock)
        checks.append(judge_intent(intent_endpoint, raw, ms, smoke))
    except (ClientError, BotoCoreError) as error:
        checks.append(Check(intent_endpoint, "batch", False, f"{type(error).__name__}: {error}"))
    return checks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.smoke",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="environment: config/<env>.yaml")
    parser.add_argument("--llm-endpoint", help="LLM endpoint name (default: the stack's)")
    parser.add_argument("--intent-endpoint", help="intent endpoint name (default: the stack's)")
    parser.add_argument("--endpoint-url", help="SageMaker runtime URL (default: AWS's)")
    parser.add_argument("--markdown", type=Path, help="append a Markdown table to this file")
    args = parser.parse_args(argv)
    config_dir = Path(os.environ.get("MANGAASSIST_CONFIG_DIR", CONFIG_DIR))
    try:
        settings = load_settings(args.env, config_dir=config_dir)
    except SettingsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    import boto3
    from botocore.config import Config

    runtime = boto3.client(
        "sagemaker-runtime", region_name=settings.region, endpoint_url=args.endpoint_url,
        # One try: a smoke test reports what a caller saw, it does not retry it away.
        config=Config(retries={"max_attempts": 1, "mode": "standard"}, read_timeout=70))
    llm = args.llm_endpoint or f"{settings.resource_prefix}-llm"
    intent = args.intent_endpoint or f"{settings.resource_prefix}-intent"
    checks = run_checks(runtime, settings, llm_endpoint=llm, intent_endpoint=intent)
    print(render_table(checks))
    if args.markdown:
        with args.markdown.open("a", encoding="utf-8") as summary:
            summary.write(render_markdown(settings.name, checks))
    return 0 if all(check.passed for check in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
