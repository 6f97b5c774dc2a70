"""OpenAI-shaped answers, built from the typed models of :mod:`gateway.api_schema`.

One place turns a finished :class:`~gateway.service.ChatRun` into a ``chat.completion``, or its
events into ``chat.completion.chunk`` Server-Sent Events, so the HTTP routes only choose between
the two. Token usage is computed once (:func:`usage`): the prompt counts only when it reached the
engine (a refusal or a fallback before generation bills no prompt tokens).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from gateway.api_schema import (
    AssistantMessage,
    ChatCompletionChunk,
    ChatCompletionResponse,
    Choice,
    ChunkChoice,
    ChunkDelta,
    FallbackInfo,
    PromptTokensDetails,
    ResponseExtension,
    Usage,
    error_body,
)
from gateway.service import ApiError, ChatRun, FinishEvent, PreparedChat, TextEvent
from gateway.telemetry import RequestRecord

RequestDone = Callable[[RequestRecord], None]
"""Logs a finished request once (``Telemetry.request``)."""

SSE_DONE = b"data: [DONE]\n\n"
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
FALLBACK_HEADER = "X-MangaAssist-Fallback"


def json_bytes(document: Any) -> bytes:
    """Compact UTF-8 JSON (no ASCII escaping: Japanese stays readable and short)."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def usage(record: RequestRecord) -> Usage:
    """Token usage of one request, in the served model's tokens."""
    prompt = record.prompt_tokens if record.reached_engine else 0
    cached = record.cached_tokens if record.reached_engine else 0
    return Usage(prompt_tokens=prompt, completion_tokens=record.completion_tokens,
                 total_tokens=prompt + record.completion_tokens,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


def final_extension(prepared: PreparedChat, finish: FinishEvent) -> ResponseExtension:
    """The request's ``mangaassist`` object with how the answer ended."""
    fallback = (FallbackInfo.model_validate(finish.fallback) if finish.fallback is not None
                else None)
    return prepared.extension.model_copy(update={
        "fallback": fallback, "deadline_exceeded": finish.deadline_exceeded})


def headers(finish: FinishEvent | None) -> dict[str, str]:
    """Response headers: the body says it all; a fallback is also flagged for proxies/logs."""
    if finish is not None and finish.fallback:
        return {FALLBACK_HEADER: finish.fallback["reason"]}
    return {}


def completion(run: ChatRun, text: str, finish: FinishEvent) -> ChatCompletionResponse:
    """The non-streamed answer (our fallback text when the engine could not answer)."""
    prepared = run.prepared
    record = prepared.record
    record.finish_reason = finish.finish_reason
    content = finish.fallback_text if finish.fallback_text is not None else text
    return ChatCompletionResponse(
        id=record.request_id, object="chat.completion", created=int(time.time()),
        model=prepared.route.served_name,
        choices=[Choice(index=0, message=AssistantMessage(role="assistant", content=content),
                        finish_reason=finish.finish_reason)],
        usage=usage(record), mangaassist=final_extension(prepared, finish))


def _event(chunk: ChatCompletionChunk) -> bytes:
    return b"data: " + chunk.model_dump_json().encode("utf-8") + b"\n\n"


async def sse(run: ChatRun, *, on_done: RequestDone) -> AsyncIterator[bytes]:
    """The streamed answer: a role chunk with the route, content chunks, one final chunk with
    finish_reason (and the fallback, if any), the usage chunk when asked for, then ``[DONE]``.

    An engine refusal after the stream started becomes an error event before ``[DONE]``. A
    client that goes away mid-stream leaves the request recorded as aborted (499, logs only).
    ``on_done`` receives the request record once, however the stream ended.
    """
    prepared = run.prepared
    record = prepared.record
    created = int(time.time())
    request = prepared.request
    include_usage = bool(request.stream_options and request.stream_options.include_usage)

    def chunk(delta: ChunkDelta, finish_reason: str | None = None,
              extension: ResponseExtension | None = None) -> bytes:
        return _event(ChatCompletionChunk(
            id=record.request_id, object="chat.completion.chunk", created=created,
            model=prepared.route.served_name,
            choices=[ChunkChoice(index=0, delta=delta, finish_reason=finish_reason)],
            mangaassist=extension))

    completed = False
    sent_text = False
    try:
        yield chunk(ChunkDelta(role="assistant", content=""), extension=prepared.extension)
        finish: FinishEvent | None = None
        async for event in run.events():
            if isinstance(event, TextEvent):
                if event.text:
                    sent_text = True
                    yield chunk(ChunkDelta(content=event.text))
            else:
                finish = event
        if finish is None:  # defensive: run() always ends with a FinishEvent
            finish = FinishEvent("stop")
        if finish.fallback_text:
            prefix = "\n\n" if sent_text else ""
            yield chunk(ChunkDelta(content=prefix + finish.fallback_text))
        record.finish_reason = finish.finish_reason
        yield chunk(ChunkDelta(), finish.finish_reason, final_extension(prepared, finish))
        if include_usage:
            yield _event(ChatCompletionChunk(
                id=record.request_id, object="chat.completion.chunk", created=created,
                model=prepared.route.served_name, choices=[], usage=usage(record)))
        yield SSE_DONE
        completed = True
    except ApiError as error:  # the engine refused the request after the stream started
        record.status = error.status
        record.outcome = "client_error"
        record.error_code = error.code
        record.error_message = error.message[:300]
        body = error_body(error.message, type_=error.type_, param=error.param, code=error.code)
        yield b"data: " + json_bytes(body) + b"\n\n"
        yield SSE_DONE
        completed = True
    finally:
        with contextlib.suppress(Exception):
            await run.close()
        if not completed:
            record.outcome = "aborted"
            record.status = 499  # client closed the stream (nginx's convention, logs only)
        on_done(record)
