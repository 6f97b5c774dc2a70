"""OpenAI-shaped answers, built from the typed models of :mod:`gateway.api.protocol`.

One place turns a finished :class:`~gateway.api.chat_run.ChatRun` into a ``chat.completion``, or
its events into ``chat.completion.chunk`` Server-Sent Events, so the HTTP routes only choose
between the two; and one place turns an :class:`~gateway.api.errors.ApiError` into the error
document (:func:`error_document`: an HTTP response, or an event of a stream already started).
Token usage is computed once (:func:`usage`): the prompt counts only when it reached the engine
(a refusal or a fallback before generation bills no prompt tokens).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi.responses import JSONResponse

from gateway.api.chat_run import Answer, ChatRun, FinishEvent, PreparedChat
from gateway.api.errors import ApiError
from gateway.api.protocol import (
    AssistantMessage,
    ChatCompletionChunk,
    ChatCompletionResponse,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    ChunkDelta,
    ErrorDetail,
    ErrorResponse,
    FallbackInfo,
    PromptTokensDetails,
    ResponseExtension,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from gateway.engines import base as engine
from gateway.telemetry import RequestRecord

RequestDone = Callable[[RequestRecord], None]
"""Logs a finished request once (``Telemetry.request``)."""

SSE_DONE = b"data: [DONE]\n\n"
LOGPROB_FLOOR = -9999.0
"""vLLM's server reports no log-probability below this (it stands for minus infinity)."""
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


def record_error(record: RequestRecord, error: ApiError) -> None:
    """The request's log fields for an answer that is ``error``."""
    record.status = error.status
    record.outcome = ("server_error" if error.status >= 500 and error.code == "internal_error"
                      else "rejected" if error.status in (429, 503) else "client_error")
    record.error_code = error.code
    record.error_param = error.param
    record.error_message = error.message[:300]


def error_document(error: ApiError) -> dict[str, Any]:
    """OpenAI's error object for ``error``: the one place an error body is built."""
    return ErrorResponse(error=ErrorDetail(message=error.message, type=error.type_,
                                           param=error.param, code=error.code)).model_dump()


def error_response(record: RequestRecord, error: ApiError,
                   extra_headers: dict[str, str] | None = None) -> JSONResponse:
    """The HTTP answer for ``error`` (its status and headers), recorded in ``record``."""
    record_error(record, error)
    return JSONResponse(error_document(error), status_code=error.status,
                        headers={**error.headers, **(extra_headers or {})})


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


def choice_logprobs(tokens: Sequence[engine.TokenLogprob], top: int | None
                    ) -> ChoiceLogprobs | None:
    """OpenAI's ``logprobs`` object for ``tokens`` (None when none were asked for): each token
    with its first ``top`` alternatives in the engine's order, as vLLM's server reports them."""
    if top is None:
        return None
    return ChoiceLogprobs(content=[
        TokenLogprob(token=t.token, logprob=max(t.logprob, LOGPROB_FLOOR),
                     bytes=list(t.bytes) if t.bytes is not None else None,
                     top_logprobs=[TopLogprob(token=token, logprob=max(logprob, LOGPROB_FLOOR),
                                              bytes=list(token.encode("utf-8", "replace")))
                                   for token, logprob in t.top[:top]])
        for t in tokens])


def completion(run: ChatRun, answer: Answer) -> ChatCompletionResponse:
    """The non-streamed answer: ``n`` choices (our fallback text in each when the engine could
    not answer)."""
    prepared = run.prepared
    record = prepared.record
    finish = answer.finish
    record.finish_reason = finish.finish_reason
    top = prepared.params.logprobs
    choices = []
    for index in range(prepared.params.n):
        content = (finish.fallback_text if finish.fallback_text is not None
                   else answer.text(index))
        logprobs = choice_logprobs(answer.logprobs.get(index, ()), top)
        choices.append(Choice(index=index,
                              message=AssistantMessage(role="assistant", content=content),
                              logprobs=logprobs if finish.fallback_text is None else None,
                              finish_reason=finish.reason_of(index)))
    return ChatCompletionResponse(
        id=record.request_id, object="chat.completion", created=int(time.time()),
        model=prepared.route.served_name, choices=choices, usage=usage(record),
        mangaassist=final_extension(prepared, finish))


def _event(chunk: ChatCompletionChunk) -> bytes:
    return b"data: " + chunk.model_dump_json().encode("utf-8") + b"\n\n"


async def sse(run: ChatRun, *, on_done: RequestDone) -> AsyncIterator[bytes]:
    """The streamed answer: a role chunk per choice (the first with the route), content chunks
    (with their tokens' logprobs when asked for), one final chunk per choice with its
    finish_reason (the last with the fallback, if any), the usage chunk when asked for, then
    ``[DONE]``.

    An engine refusal after the stream started becomes an error event before ``[DONE]``. A
    client that goes away mid-stream leaves the request recorded as aborted (499, logs only).
    ``on_done`` receives the request record once, however the stream ended.
    """
    prepared = run.prepared
    record = prepared.record
    created = int(time.time())
    request = prepared.request
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    choices, top = prepared.params.n, prepared.params.logprobs

    def chunk(index: int, delta: ChunkDelta, finish_reason: str | None = None,
              extension: ResponseExtension | None = None,
              logprobs: ChoiceLogprobs | None = None) -> bytes:
        return _event(ChatCompletionChunk(
            id=record.request_id, object="chat.completion.chunk", created=created,
            model=prepared.route.served_name,
            choices=[ChunkChoice(index=index, delta=delta, finish_reason=finish_reason,
                                 logprobs=logprobs)],
            mangaassist=extension))

    completed = False
    sent_text: set[int] = set()
    try:
        for index in range(choices):
            yield chunk(index, ChunkDelta(role="assistant", content=""),
                        extension=prepared.extension if index == 0 else None)
        finish: FinishEvent | None = None
        async for event in run.events():
            if isinstance(event, FinishEvent):
                finish = event
            elif event.text or (top is not None and event.logprobs):
                if event.text:
                    sent_text.add(event.choice)
                yield chunk(event.choice, ChunkDelta(content=event.text),
                            logprobs=choice_logprobs(event.logprobs, top))
        if finish is None:  # defensive: run() always ends with a FinishEvent
            finish = FinishEvent("stop")
        if finish.fallback_text:
            for index in range(choices):
                prefix = "\n\n" if index in sent_text else ""
                yield chunk(index, ChunkDelta(content=prefix + finish.fallback_text))
        record.finish_reason = finish.finish_reason
        for index in range(choices):
            last = index == choices - 1
            yield chunk(index, ChunkDelta(), finish.reason_of(index),
                        final_extension(prepared, finish) if last else None)
        if include_usage:
            yield _event(ChatCompletionChunk(
                id=record.request_id, object="chat.completion.chunk", created=created,
                model=prepared.route.served_name, choices=[], usage=usage(record)))
        yield SSE_DONE
        completed = True
    except ApiError as error:  # the engine refused the request after the stream started
        record_error(record, error)
        yield b"data: " + json_bytes(error_document(error)) + b"\n\n"
        yield SSE_DONE
        completed = True
    finally:
        with contextlib.suppress(Exception):
            await run.close()
        if not completed:
            record.outcome = "aborted"
            record.status = 499  # client closed the stream (nginx's convention, logs only)
        on_done(record)
