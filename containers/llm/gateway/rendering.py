"""Which rendering the gateway sends to the engine: checked against the engine's own tokenizer.

The gateway renders every prompt itself, because it must count a conversation's tokens before it
decides what to keep (the sliding window), and it does so fast: each message's token ids are
cached and assembled between the chat template's literal pieces (:mod:`gateway.tokenizer`). A
model must see exactly the prompt it was trained on, so when an engine starts, the gateway renders
a set of probe conversations — Japanese and English, emoji, odd whitespace, the system messages
the gateway itself inserts (retrieved context, the truncation marker), long and short — both ways
and compares the token ids with the engine tokenizer's ``apply_chat_template``:

* all equal → :attr:`PromptRendering.ASSEMBLED` (or ``WHOLE_TEXT`` where the tokenizer already
  found at load time that assembly is not exact for it);
* assembled ids differ but the whole rendered text, tokenized at once, matches →
  ``WHOLE_TEXT`` (slower, exact);
* both differ (a template or tokenizer behaviour the gateway does not reproduce) →
  ``ENGINE_TOKENIZER``: the engine tokenizer renders every prompt. The gateway still budgets with
  its own counts and re-checks the real length, so the window stays exact.

Never is a prompt the model was not trained on kept in service: the outcome is logged and shown in
/ping. Pure module: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from gateway.engines.base import ChatRenderer
from gateway.tokenizer import ChatTemplateError, ChatTokenizer, ChatTurn


class PromptRendering(StrEnum):
    """How prompts are turned into token ids."""

    ASSEMBLED = "assembled"
    """Cached per-message ids between the template's literal pieces (the fast path)."""
    WHOLE_TEXT = "whole_text"
    """The chat template rendered by the gateway, the whole text tokenized at once."""
    ENGINE_TOKENIZER = "engine_tokenizer"
    """The engine tokenizer's ``apply_chat_template`` renders every prompt (the fallback)."""


MARKER_PROBE = "[earlier conversation truncated — 3 turns not shown]"
RAG_PROBE = ("Reference information (retrieved for the current question):\n"
             "- One Piece volume 1: 216 pages, ¥484\n- 鬼滅の刃 全23巻")
PROBE_CONVERSATIONS: tuple[tuple[tuple[str, str], ...], ...] = (
    (("system", "You are MangaAssist."), ("user", "鬼滅の刃に似たマンガは？"),
     ("assistant", "『呪術廻戦』がおすすめです。"), ("user", "Is volume 1 in English?")),
    (("user", "x"),),
    (("system", "You are MangaAssist, a manga shop assistant."), ("system", MARKER_PROBE),
     ("user", "And the deluxe edition?"), ("assistant", "It has color pages 🙂 and a hardcover."),
     ("system", RAG_PROBE), ("user", "ワンピース 1巻 (English) and 2巻!")),
    (("system", "line one\nline two\n\nline four"), ("user", "'s apostrophe first"),
     ("assistant", "¿Qué? 'single' and \"double\" — dashes…"),
     ("user", "🙂 emoji first,\ttabs\tand  double  spaces")),
    (("user", "34 volumes, 7 colossal editions."), ("assistant", ""),
     ("user", "Where is my order #12345?")),
)
"""Conversations as the gateway sends them (contents already trimmed, roles as rendered)."""


@dataclass(frozen=True)
class RenderingCheck:
    """The outcome of comparing the gateway's rendering with the engine tokenizer's."""

    mode: PromptRendering
    matches: bool
    """True when the gateway's own fast path gave the engine tokenizer's ids for every probe."""
    detail: str
    probe: int | None = None
    """Index of the first probe whose ids differed (None when all matched)."""
    position: int | None = None
    """First differing token position in that probe."""
    gateway_tokens: int | None = None
    engine_tokens: int | None = None


def _first_difference(ours: Sequence[int], theirs: Sequence[int]) -> int:
    for index, (mine, other) in enumerate(zip(ours, theirs, strict=False)):
        if mine != other:
            return index
    return min(len(ours), len(theirs))


def _messages(conversation: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"role": role, "content": content} for role, content in conversation]


def check_rendering(tokenizer: ChatTokenizer, reference: ChatRenderer,
                    probes: Sequence[Sequence[tuple[str, str]]] = PROBE_CONVERSATIONS
                    ) -> RenderingCheck:
    """Compare on ``probes`` and choose the rendering (see the module docstring).

    Does not change ``tokenizer``; :func:`apply_rendering` does. ``reference`` errors propagate
    (the caller reports a check that could not run).
    """
    fast = PromptRendering.ASSEMBLED if tokenizer.segmented else PromptRendering.WHOLE_TEXT
    expected = [list(reference(_messages(conversation))) for conversation in probes]
    turns = [[ChatTurn(role, content) for role, content in conversation]
             for conversation in probes]
    saved, tokenizer.reference = tokenizer.reference, None
    try:
        first_mismatch: RenderingCheck | None = None
        for index, (conversation, theirs) in enumerate(zip(turns, expected, strict=True)):
            try:
                ours = list(tokenizer.render_prompt(conversation).token_ids)
            except ChatTemplateError as error:
                ours, detail = [], f"the gateway's template refused probe {index}: {error}"
            else:
                detail = ""
            if ours != theirs:
                first_mismatch = RenderingCheck(
                    mode=fast, matches=False,
                    detail=detail or f"probe {index} differs at token "
                                     f"{_first_difference(ours, theirs)}",
                    probe=index, position=_first_difference(ours, theirs),
                    gateway_tokens=len(ours), engine_tokens=len(theirs))
                break
        if first_mismatch is None:
            return RenderingCheck(mode=fast, matches=True,
                                  detail=f"{len(probes)} probe conversations identical")
        if fast is PromptRendering.ASSEMBLED and _whole_text_matches(tokenizer, turns, expected):
            mode = PromptRendering.WHOLE_TEXT
            why = "the whole rendered text matches: per-message assembly is off"
        else:
            mode = PromptRendering.ENGINE_TOKENIZER
            why = "the engine tokenizer renders every prompt"
        return RenderingCheck(mode=mode, matches=False,
                              detail=f"{first_mismatch.detail}; {why}",
                              probe=first_mismatch.probe, position=first_mismatch.position,
                              gateway_tokens=first_mismatch.gateway_tokens,
                              engine_tokens=first_mismatch.engine_tokens)
    finally:
        tokenizer.reference = saved


def _whole_text_matches(tokenizer: ChatTokenizer, turns: Sequence[Sequence[ChatTurn]],
                        expected: Sequence[Sequence[int]]) -> bool:
    try:
        return all(tokenizer.render_whole(conversation) == list(theirs)
                   for conversation, theirs in zip(turns, expected, strict=True))
    except ChatTemplateError:
        return False


def apply_rendering(tokenizer: ChatTokenizer, check: RenderingCheck,
                    reference: ChatRenderer) -> None:
    """Make ``tokenizer`` render prompts the way ``check`` chose."""
    if check.mode is PromptRendering.ENGINE_TOKENIZER:
        tokenizer.reference = reference
        return
    tokenizer.reference = None
    if check.mode is PromptRendering.WHOLE_TEXT:
        tokenizer.segmented = False
