"""The post-deploy smoke test's requests and judgements (pure: no boto3, no I/O).

``tools/smoke.py`` sends these requests to the live endpoints and hands the answers here. Each
judgement returns a :class:`Check` whose ``detail`` is the line a person reads when it fails:
what was expected, what came back.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from intents import INTENT_LABELS
from serving_contract import BASE_ROUTE
from stacks.settings import LlmEndpointSettings, SmokeSettings

JA_CONVERSATION: tuple[dict[str, str], ...] = (
    {"role": "user", "content": "『ONE PIECE』は今何巻まで出ていますか？"},
    {"role": "assistant", "content": "最新刊は第110巻です。まとめ買いもできます。"},
    {"role": "user", "content": "1巻から10巻までまとめて買うといくらですか？"},
)
EN_CONVERSATION: tuple[dict[str, str], ...] = (
    {"role": "user", "content": "I loved Demon Slayer. What should I read next?"},
    {"role": "assistant", "content": "You might enjoy \"Jujutsu Kaisen\" or \"Chainsaw Man\"."},
    {"role": "user", "content": "Which of those is finished, and how many volumes is it?"},
)
SESSION_FOLLOW_UP = "Is the first volume of that series in stock?"
"""The second turn of the session check (after the first turn's answer)."""
NEW_SESSION_VALUE = re.compile(r"^(?P<id>[a-zA-Z0-9](-*[a-zA-Z0-9])*); Expires=(?P<expires>"
                               r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)$")
"""``NewSessionId`` as the gateway writes it (gateway.sessions): ``<id>; Expires=<UTC>``."""
ROUTED_INTENT, ROUTED_LOCALE = "recommendation", "ja-JP"
INTENT_BATCH: tuple[tuple[str, str], ...] = (
    ("注文した『呪術廻戦』の最新刊はいつ届きますか？", "order_tracking"),
    ("Can you recommend manga like Naruto?", "recommendation"),
    ("破れた本が届いたので返品したいです", "return_request"),
    ("Is volume 3 of Spy x Family in stock?", "product_question"),
)


@dataclass(frozen=True)
class Check:
    """One row of the smoke table."""

    endpoint: str
    name: str
    passed: bool
    detail: str
    latency_ms: float | None = None
    ttft_ms: float | None = None


def chat_body(messages: Sequence[Mapping[str, str]], smoke: SmokeSettings, *,
              extension: Mapping[str, Any] | None = None, stream: bool = False) -> bytes:
    """An /invocations body in the gateway's schema (OpenAI chat + the mangaassist object)."""
    body: dict[str, Any] = {"messages": list(messages), "max_tokens": smoke.max_tokens,
                            "temperature": 0}
    if extension:
        body["mangaassist"] = dict(extension)
    if stream:
        body["stream"] = True
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


def expected_adapter(llm: LlmEndpointSettings, intent: str, locale: str) -> str | None:
    """The adapter the gateway must pick for intent + locale (None: the base model)."""
    adapter = llm.routing.get(intent, BASE_ROUTE)
    adapter = llm.locale_routes.get(locale, {}).get(adapter, adapter)
    return None if adapter == BASE_ROUTE else adapter


def judge_chat(endpoint: str, name: str, raw: bytes, latency_ms: float, smoke: SmokeSettings,
               *, adapter: str | None = None, route: str | None = None) -> Check:
    """A non-streamed answer: a non-empty, non-fallback completion within the latency limit."""
    def fail(detail: str) -> Check:
        return Check(endpoint, name, False, detail, latency_ms)

    try:
        answer = json.loads(raw)
        content = answer["choices"][0]["message"]["content"]
        extension = answer["mangaassist"]
    except (ValueError, KeyError, IndexError, TypeError) as error:
        return fail(f"not a chat completion ({type(error).__name__}: {error}): {raw[:200]!r}")
    fallback = extension.get("fallback")
    if fallback:
        return fail(f"fallback answer ({fallback.get('reason')}): {fallback.get('detail')}")
    if not isinstance(content, str) or not content.strip():
        return fail("empty answer")
    routed = extension.get("adapter") != adapter or (route and extension.get("route") != route)
    if (adapter is not None or route is not None) and routed:
        return fail(f"routed to adapter {extension.get('adapter')!r} by "
                    f"{extension.get('route')!r}; expected {adapter!r} by {route!r}")
    if latency_ms > smoke.llm_latency_ms:
        return fail(f"{latency_ms:.0f} ms > {smoke.llm_latency_ms:.0f} ms (smoke.llm_latency_ms)")
    where = f", adapter {extension.get('adapter') or 'base'}" if adapter or route else ""
    return Check(endpoint, name, True, f"{len(content)} chars{where}", latency_ms)


class SseAssembler:
    """Server-sent events from arbitrary byte pieces (SageMaker cuts PayloadParts anywhere)."""

    def __init__(self) -> None:
        self._buffer = b""
        self.data: list[str] = []

    def feed(self, piece: bytes) -> list[str]:
        """Add bytes; return the ``data:`` payloads completed by them."""
        self._buffer += piece
        completed: list[str] = []
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            text = line.decode("utf-8").rstrip("\r")
            if text.startswith("data:"):
                completed.append(text[5:].strip())
        self.data.extend(completed)
        return completed

    @property
    def leftover(self) -> bytes:
        """Bytes after the last newline (a stream that stopped mid-line)."""
        return self._buffer


@dataclass
class StreamRecord:
    """What the smoke test saw of one streamed answer."""

    data: list[str] = field(default_factory=list)
    first_content_ms: float | None = None
    total_ms: float = 0.0
    error: str | None = None
    leftover: bytes = b""


def judge_stream(endpoint: str, record: StreamRecord, smoke: SmokeSettings) -> Check:
    """Every chunk parses; role first, content, a finish_reason, then [DONE]; no fallback."""
    chunks: list[dict[str, Any]] = []
    problem = _stream_framing_problem(record)
    if problem is None:
        chunks, problem = _stream_chunks(record.data[:-1])
    choices = [choice for chunk in chunks for choice in chunk.get("choices", [])]
    text = "".join(choice.get("delta", {}).get("content") or "" for choice in choices)
    finish = [choice["finish_reason"] for choice in choices if choice.get("finish_reason")]
    if problem is None:
        problem = (_stream_answer_problem(chunks, choices, text, finish)
                   or _stream_timing_problem(record, smoke))
    if problem is not None:
        return Check(endpoint, "stream", False, problem, record.total_ms, record.first_content_ms)
    return Check(endpoint, "stream", True, f"{len(chunks)} chunks, {len(text)} chars, "
                 f"finish {finish[-1]}", record.total_ms, record.first_content_ms)


def _stream_framing_problem(record: StreamRecord) -> str | None:
    """The stream broke off: an error, or no [DONE] at the end."""
    if record.error:
        return f"stream broke off after {len(record.data)} events: {record.error}"
    if not record.data or record.data[-1] != "[DONE]":
        tail = f" (then {len(record.leftover)} bytes without a newline)" if record.leftover else ""
        return f"stream broke off: {len(record.data)} events and no [DONE]{tail}"
    return None


def _stream_chunks(payloads: Sequence[str]) -> tuple[list[dict[str, Any]], str | None]:
    """The events before the final [DONE] as chat.completion.chunk objects, or what is wrong."""
    if "[DONE]" in payloads:
        return [], "events after [DONE]"
    chunks: list[dict[str, Any]] = []
    for index, payload in enumerate(payloads):
        try:
            chunks.append(json.loads(payload))
        except ValueError:
            return [], f"event {index} is not JSON: {payload[:120]!r}"
    if any(not isinstance(chunk, dict) or chunk.get("object") != "chat.completion.chunk"
           for chunk in chunks):
        return [], "an event is not a chat.completion.chunk"
    return chunks, None


def _stream_answer_problem(chunks: Sequence[Mapping[str, Any]],
                           choices: Sequence[Mapping[str, Any]], text: str,
                           finish: Sequence[str]) -> str | None:
    """The answer is not a real one: no assistant role first, a fallback, no text, no finish."""
    if not choices or choices[0].get("delta", {}).get("role") != "assistant":
        return "the first chunk has no assistant role"
    fallbacks = [chunk["mangaassist"]["fallback"] for chunk in chunks
                 if (chunk.get("mangaassist") or {}).get("fallback")]
    if fallbacks:
        return f"fallback answer ({fallbacks[-1].get('reason')}): {fallbacks[-1].get('detail')}"
    if not text.strip():
        return "no content in the stream"
    if list(finish[-1:]) not in (["stop"], ["length"]):
        return f"no finish_reason stop/length (got {list(finish)})"
    return None


def _stream_timing_problem(record: StreamRecord, smoke: SmokeSettings) -> str | None:
    """Time to first token or the whole answer over the smoke settings' limits."""
    ttft, limit = record.first_content_ms, smoke.llm_time_to_first_token_ms
    if ttft is None or ttft > limit:
        return f"time to first token {ttft} ms > {limit:.0f} ms (smoke.llm_time_to_first_token_ms)"
    if record.total_ms > smoke.llm_latency_ms:
        return f"{record.total_ms:.0f} ms > {smoke.llm_latency_ms:.0f} ms"
    return None


def has_content(payload: str) -> bool:
    """Whether one SSE data payload carries generated text (for time to first token)."""
    if payload == "[DONE]":
        return False
    try:
        chunk = json.loads(payload)
    except ValueError:
        return False
    return any((choice.get("delta") or {}).get("content") for choice in chunk.get("choices", []))


def session_id_of(new_session_id: str | None) -> str | None:
    """The id in a ``NewSessionId`` value, or None when it is not ``<id>; Expires=<UTC>``."""
    match = NEW_SESSION_VALUE.match(new_session_id or "")
    return match["id"] if match else None


@dataclass
class SessionRecord:
    """What the smoke test saw of one stateful session: opened, two turns, closed."""

    opened: list[str] = field(default_factory=list)
    """Every ``NewSessionId`` received (a second one when the session had to be reopened)."""
    turns: list[tuple[bytes, float]] = field(default_factory=list)
    closed: str | None = None
    error: str | None = None


def _session_turn_problem(index: int, raw: bytes, session_id: str) -> tuple[str | None, int]:
    """What is wrong with turn ``index`` of the session; (problem, prompt tokens)."""
    try:
        answer = json.loads(raw)
        content = answer["choices"][0]["message"]["content"]
        extension, usage = answer["mangaassist"], answer["usage"]
    except (ValueError, KeyError, IndexError, TypeError) as error:
        return f"turn {index + 1} is not a chat completion ({error}): {raw[:120]!r}", 0
    if extension.get("fallback"):
        return f"turn {index + 1} is a fallback ({extension['fallback'].get('reason')})", 0
    if not str(content).strip():
        return f"turn {index + 1} is empty", 0
    session = extension.get("session") or {}
    if session != {"id": session_id, "state": "active"}:
        return (f"turn {index + 1} did not reach the session's instance: mangaassist.session "
                f"{session or None}"), 0
    return None, int(usage["prompt_tokens"])


def judge_session(endpoint: str, record: SessionRecord, smoke: SmokeSettings, *,
                  block_size: int) -> Check:
    """A session opens with an id and an expiry, both turns reach its instance (the second finds
    the first one's prompt in the prefix cache), and it closes. Reopened once after a lost
    instance, it passes without the cache criterion (the documented recovery)."""
    latency = sum(ms for _, ms in record.turns) or None

    def fail(detail: str) -> Check:
        return Check(endpoint, "session", False, detail, latency)

    if record.error:
        return fail(record.error)
    session_id = session_id_of(record.opened[-1] if record.opened else None)
    if session_id is None:
        return fail(f"NewSessionId {record.opened[-1:] or None} is not '<id>; Expires=<UTC>'")
    if len(record.turns) != 2:
        return fail(f"{len(record.turns)} turns answered, 2 expected")
    prompts: list[int] = []
    for index, (raw, _) in enumerate(record.turns):
        problem, prompt_tokens = _session_turn_problem(index, raw, session_id)
        if problem:
            return fail(problem)
        prompts.append(prompt_tokens)
    cached = json.loads(record.turns[1][0])["usage"]["prompt_tokens_details"]["cached_tokens"]
    if len(record.opened) == 1 and cached < prompts[0] - block_size:
        return fail(f"turn 2 found {cached} of turn 1's {prompts[0]} prompt tokens cached; its "
                    "instance should hold them all but the last block")
    if record.closed != session_id:
        return fail(f"ClosedSessionId {record.closed!r}, expected {session_id!r}")
    reopened = " (reopened once)" if len(record.opened) > 1 else ""
    return Check(endpoint, "session", True,
                 f"2 turns on its instance{reopened}, turn 2 cached {cached} of "
                 f"{json.loads(record.turns[1][0])['usage']['prompt_tokens']} prompt tokens, "
                 "closed", latency)


def intent_body(batch: Iterable[tuple[str, str]] = INTENT_BATCH) -> bytes:
    """The intent endpoint's batch request: ``{"texts": [...]}``."""
    return json.dumps({"texts": [text for text, _ in batch]}, ensure_ascii=False).encode()


def judge_intent(endpoint: str, raw: bytes, latency_ms: float, smoke: SmokeSettings,
                 batch: Sequence[tuple[str, str]] = INTENT_BATCH) -> Check:
    """One well-formed prediction per text, enough of them right, within the latency limit."""
    def fail(detail: str) -> Check:
        return Check(endpoint, "batch", False, detail, latency_ms)

    try:
        predictions = json.loads(raw)["predictions"]
    except (ValueError, KeyError, TypeError) as error:
        return fail(f"not a batch answer ({type(error).__name__}: {error}): {raw[:200]!r}")
    if not isinstance(predictions, list) or len(predictions) != len(batch):
        return fail(f"{len(predictions) if isinstance(predictions, list) else 'no'} predictions "
                    f"for {len(batch)} texts")
    right = 0
    for index, (prediction, (_, expected)) in enumerate(zip(predictions, batch, strict=True)):
        intent, confidence = prediction.get("intent"), prediction.get("confidence")
        scores = prediction.get("scores") or {}
        if intent not in INTENT_LABELS:
            return fail(f"predictions[{index}].intent {intent!r} is not a known intent")
        if not isinstance(confidence, int | float) or not 0 <= confidence <= 1:
            return fail(f"predictions[{index}].confidence {confidence!r} is not in [0, 1]")
        if not math.isclose(sum(scores.values()), 1.0, abs_tol=1e-3):
            return fail(f"predictions[{index}].scores sum to {sum(scores.values()):.4f}, not 1")
        right += intent == expected
    agreement = right / len(batch)
    if agreement < smoke.min_intent_agreement:
        return fail(f"{right}/{len(batch)} intents as expected < {smoke.min_intent_agreement:.0%} "
                    "(smoke.min_intent_agreement)")
    if latency_ms > smoke.intent_latency_ms:
        return fail(f"{latency_ms:.0f} ms > {smoke.intent_latency_ms:.0f} ms "
                    "(smoke.intent_latency_ms)")
    return Check(endpoint, "batch", True, f"{len(batch)} texts, {right} as expected", latency_ms)


def render_table(checks: Sequence[Check]) -> str:
    """A fixed-width table, then one FAIL line per failed check (the reasons)."""
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    rows = [("endpoint", "check", "result", "latency ms", "ttft ms", "detail")]
    rows += [(c.endpoint, c.name, "ok" if c.passed else "FAIL", ms(c.latency_ms), ms(c.ttft_ms),
              c.detail if c.passed else "see below") for c in checks]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row[:5], widths, strict=True))
             + "  " + row[5] for row in rows]
    failed = [c for c in checks if not c.passed]
    lines += [f"FAIL {c.endpoint} {c.name}: {c.detail}" for c in failed]
    lines.append(f"smoke: {len(checks) - len(failed)} passed, {len(failed)} failed")
    return "\n".join(line.rstrip() for line in lines)


def render_markdown(environment: str, checks: Sequence[Check]) -> str:
    """The same, as a Markdown table for the CI job summary."""
    lines = [f"## Smoke test: {environment}", "",
             "| endpoint | check | result | latency ms | ttft ms | detail |",
             "|---|---|---|---|---|---|"]
    for c in checks:
        detail = c.detail.replace("|", "\\|")
        lines.append(f"| {c.endpoint} | {c.name} | {'ok' if c.passed else '**FAIL**'} | "
                     f"{'-' if c.latency_ms is None else f'{c.latency_ms:.0f}'} | "
                     f"{'-' if c.ttft_ms is None else f'{c.ttft_ms:.0f}'} | {detail} |")
    return "\n".join(lines) + "\n"
