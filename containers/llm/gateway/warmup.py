"""Warmup: representative requests through the full HTTP path before /ping turns green.

SageMaker must not route users to a cold instance (docs/design-decisions.md#cold-start-gate).
After the engine has started, the gateway sends, through its own ASGI app (validation, routing,
context budget, admission, engine, response formatting — everything but the socket): a short, a
medium and a long conversation for the base model and for every adapter, one request routed by
intent and locale, and one streaming request. The long one overflows the history budget, so the
sliding window and its marker run too. Only when every answer is a 200 that is not a fallback
does /ping say healthy. Then a batch of short requests runs concurrently, so that admission's
prefill valve measures how fast the engine drains a backlog of prompts
(gateway.admission.valve) before the first real burst arrives. Warmup requests carry a
per-process secret header so they are logged but not counted in the request metrics.

The lifecycle runs this set twice (:mod:`gateway.lifecycle`): the first pass is the engine's
first use of each shape — Triton compiling attention and LoRA kernels, the first load of each
adapter — whose one-off seconds must not be learned as the engine's speed; the second measures.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from gateway.settings import Settings
from prompts import MANGA_CORPUS_EN, MANGA_CORPUS_JA, MANGAASSIST_SYSTEM_PROMPT, SYSTEM_PROMPT_EN

LogCallback = Callable[..., None]

WARMUP_HEADER = "x-mangaassist-warmup"
_TOKENS_PER_MESSAGE = 80
CALIBRATION_BATCH = 16
"""Concurrent warmup requests (at most ENGINE_MAX_NUM_SEQS): the batch admission learns from."""
CALIBRATION_TOKENS = 24


def _message(index: int, tokens_target: int, count: Callable[[str], int]) -> str:
    parts: list[str] = []
    position = index
    while not parts or count(" ".join(parts)) < tokens_target:
        pool = MANGA_CORPUS_JA if position % 2 else MANGA_CORPUS_EN
        parts.append(pool[position % len(pool)])
        position += 7
    return " ".join(parts)


def warmup_requests(settings: Settings, *, served_names: Sequence[str],
                    count: Callable[[str], int], log: LogCallback
                    ) -> list[tuple[str, dict[str, Any]]]:
    """(label, body) of every warmup request for these models and this budget.

    ``count`` is the served tokenizer's token count of a text; ``log`` the telemetry's log.
    """
    max_model_len = settings.engine.max_model_len

    history_cap = settings.gateway.context_split.history * max_model_len
    long_turns = min(settings.gateway.max_messages - 2,
                     max(12, math.ceil(1.5 * history_cap / _TOKENS_PER_MESSAGE) + 1))
    if long_turns % 2 == 0:
        long_turns += 1  # end on a user message
    shapes = {"short": (1, 4), "medium": (9, 8), "long": (long_turns, 16)}
    system_prompt = MANGAASSIST_SYSTEM_PROMPT
    system_tokens = count(system_prompt)
    system_budget = int(settings.gateway.context_split.system * max_model_len)
    if system_tokens > system_budget:
        # Production traffic carrying this prompt would be refused too: say so loudly, and warm
        # up with a prompt that fits so the rest of the path is still exercised.
        log(
            "warmup_system_prompt_over_budget", level="warning", system_prompt_tokens=system_tokens,
            system_budget_tokens=system_budget,
            message="the production system prompt does not fit the system share of "
                    "ENGINE_MAX_MODEL_LEN (GATEWAY_CONTEXT_SPLIT); warming up with a short one",
        )
        system_prompt = SYSTEM_PROMPT_EN
    requests: list[tuple[str, dict[str, Any]]] = []
    for model in served_names:
        for shape, (turns, max_tokens) in shapes.items():
            # The production system prompt: its KV blocks stay in the prefix cache, and it is the
            # prompt the AWQ model was calibrated on and its quality gate sends.
            messages = [{"role": "system", "content": system_prompt}]
            for index in range(turns):
                role = "user" if (turns - 1 - index) % 2 == 0 else "assistant"
                messages.append({"role": role,
                                 "content": _message(index, _TOKENS_PER_MESSAGE, count)})
            requests.append((f"{model}/{shape}", {"model": model, "messages": messages,
                                                   "max_tokens": max_tokens}))
    requests.append(("auto/ja-JP", {
        "model": "auto", "max_tokens": 16,
        "messages": [{"role": "user", "content": MANGA_CORPUS_JA[2]}],
        "mangaassist": {"intent": "recommendation", "locale": "ja-JP",
                        "rag_context": [MANGA_CORPUS_JA[3], MANGA_CORPUS_EN[3]]},
    }))
    requests.append(("stream", {
        "model": settings.gateway.served_model_name, "max_tokens": 16, "stream": True,
        "messages": [{"role": "user", "content": MANGA_CORPUS_EN[1]}],
    }))
    return requests


def salted(requests: Sequence[tuple[str, dict[str, Any]]], salt: str
           ) -> list[tuple[str, dict[str, Any]]]:
    """``requests`` with ``salt`` at the start of every message but the system prompt, so that
    whichever turns the sliding window keeps, the prompt after the system prompt begins with it.
    A pass's prompts then share no KV block with an earlier pass's beyond the system prompt,
    which real traffic shares too. Without it vLLM's prefix cache served the measuring pass
    the first pass's blocks (a 470-token prompt with 448 cached, its first token in 26 ms
    where it took 243 ms uncached), and admission learned a prefill of cache hits: 20,995
    prompt tokens a second on vLLM's CPU build, where the first burst of distinct chats then
    prefilled at about 1,500."""
    out: list[tuple[str, dict[str, Any]]] = []
    for label, body in requests:
        messages = [message if message.get("role") == "system"
                    else {**message, "content": salt + str(message["content"])}
                    for message in body["messages"]]
        out.append((label, {**body, "messages": messages}))
    return out


def short_request(requests: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The body of the first ``short`` warmup request: the request whose first token on the
    idle engine, at the drain rate measured, must be within the SLO before /ping turns
    healthy."""
    for label, body in requests:
        if label.endswith("/short"):
            return body
    raise ValueError("the warmup set has no short request")


def calibration_batch(settings: Settings, *, salt: str = "") -> list[dict[str, Any]]:
    """Short, distinct requests to send at once (see the module docstring), each beginning
    with ``salt`` (see :func:`salted`)."""
    size = min(CALIBRATION_BATCH, settings.engine.max_num_seqs)
    return [{"model": settings.gateway.served_model_name, "max_tokens": CALIBRATION_TOKENS,
             "messages": [{"role": "user", "content": f"{salt}({index}) "
                           f"{MANGA_CORPUS_EN[index % len(MANGA_CORPUS_EN)]} "
                           f"{MANGA_CORPUS_JA[index % len(MANGA_CORPUS_JA)]}"}]}
            for index in range(size)]


async def run_calibration(client: httpx.AsyncClient, batch: Sequence[dict[str, Any]], *,
                          headers: dict[str, str], log: LogCallback) -> bool:
    """Send ``batch`` at once; True unless an answer is neither 200 nor 429 (admission may
    refuse part of it on a small pool, which is admission working, not a failed warmup)."""
    responses = await asyncio.gather(
        *(client.post("/invocations", json=body, headers=headers) for body in batch),
        return_exceptions=True)
    statuses = [r.status_code if isinstance(r, httpx.Response) else repr(r) for r in responses]
    if any(status not in (200, 429) for status in statuses) or 200 not in statuses:
        log("warmup_failed", level="warning", request="calibration batch", statuses=statuses)
        return False
    return True


async def run_warmup(client: httpx.AsyncClient, requests: Sequence[tuple[str, dict[str, Any]]],
                     *, headers: dict[str, str], progress: Callable[[str], None],
                     log: LogCallback, batch: Sequence[dict[str, Any]] = ()) -> bool:
    """Send every warmup request, then ``batch`` at once; True when all answered 200 without
    a fallback (the batch: see :func:`run_calibration`)."""
    for done, (label, body) in enumerate(requests):
        progress(f"warmup {done}/{len(requests)} requests ({label} next)")
        try:
            response = await client.post("/invocations", json=body, headers=headers)
        except httpx.HTTPError as error:
            log("warmup_failed", level="warning", request=label, error=repr(error))
            return False
        fallback = response.headers.get("X-MangaAssist-Fallback")
        complete = (not body.get("stream")) or response.text.rstrip().endswith("data: [DONE]")
        if response.status_code != 200 or fallback or not complete:
            log("warmup_failed", level="warning", request=label, status=response.status_code,
                fallback=fallback, body=response.text[:300])
            return False
    if batch:
        progress(f"warmup {len(requests)}/{len(requests)} requests; a batch of {len(batch)} at "
                 "once next")
        if not await run_calibration(client, batch, headers=headers, log=log):
            return False
    progress(f"warmup {len(requests)}/{len(requests)} requests done")
    return True
