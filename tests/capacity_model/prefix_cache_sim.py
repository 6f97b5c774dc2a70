"""An independent reference for the prefix-reuse prediction: real token lists, vLLM's block hashes.

The capacity model predicts cache hits from message sizes (:mod:`capacity_model.prefix_reuse`).
This module does it the long way, as the engine does: it asks the gateway's own context budget
(``plan_context``) which messages each turn keeps, renders every prompt as a list of distinct
tokens (each message's tokens are its own; the assistant header is the same few tokens
everywhere), and runs vLLM's automatic prefix caching over them — every full block hashed with
the hash of the block before it, a request reusing the leading blocks whose hashes some earlier
request computed, never its last prompt token, and the tokens it generated cached as they fill
blocks (all but the last, which is sampled and never fed back). It also writes a file in the
format of ``config/prefix_reuse.json`` (``benchmarks/conversation_replay.py``'s output), so the
comparison code can be exercised before the measured file exists.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from capacity_model.prefix_reuse import ChatTurn, Geometry, PromptLayout
from gateway.context_budget import BudgetMessage, plan_context
from gateway.settings import ContextSplit

Token = Hashable


def _message_tokens(name: str, count: int) -> list[Token]:
    return [(name, i) for i in range(count)]


def _plan(turns: Sequence[ChatTurn], index: int, layout: PromptLayout, geometry: Geometry):  # type: ignore[no-untyped-def]
    window = geometry.window
    messages = [BudgetMessage(0, "system", layout.system_tokens)]
    for k, turn in enumerate(turns[:index]):
        messages.append(BudgetMessage(2 * k + 1, "user", turn.user_tokens))
        messages.append(BudgetMessage(2 * k + 2, "assistant", turn.answer_tokens))
    messages.append(BudgetMessage(2 * index + 1, "user", turns[index].user_tokens))
    rag = turns[index].rag_tokens
    return plan_context(
        messages, max_model_len=geometry.max_model_len,
        max_output_tokens=geometry.output_tokens,
        split=ContextSplit(window.system, window.rag, window.history, window.output),
        fixed_overhead_tokens=layout.fixed_tokens,
        marker_tokens=lambda _n: layout.marker_tokens, step_turns=window.step_turns,
        rag_chunk_tokens=[rag] if rag else [], rag_overhead_tokens=0)


def _render(turns: Sequence[ChatTurn], index: int, layout: PromptLayout, plan: Any) -> list[Token]:
    header = _message_tokens("assistant-header", layout.generation_header_tokens)
    tokens = _message_tokens("opening", layout.opening_tokens)
    tokens += _message_tokens("system", layout.system_tokens)
    if plan.dropped_indices:
        tokens += _message_tokens(f"marker-{plan.dropped_turns}", layout.marker_tokens)
    for position in plan.kept_indices[1:-1]:  # less the system prompt and the question
        turn, answer = divmod(position - 1, 2)
        if answer:
            tokens += header + _message_tokens(
                f"answer-{turn}", turns[turn].answer_tokens - layout.generation_header_tokens)
        else:
            tokens += _message_tokens(f"user-{turn}", turns[turn].user_tokens)
    if plan.rag_chunks_kept:
        tokens += _message_tokens(f"rag-{index}", turns[index].rag_tokens)
    tokens += _message_tokens(f"user-{index}", turns[index].user_tokens)
    return tokens + header


def _block_hashes(tokens: Sequence[Token], block_size: int) -> list[int]:
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start:start + block_size])))
        hashes.append(parent)
    return hashes


def simulate(turns: Sequence[ChatTurn], layout: PromptLayout,
             geometry: Geometry) -> list[dict[str, Any]]:
    """Per turn: prompt tokens, cached tokens, dropped messages, the new messages' sizes."""
    cache: set[int] = set()
    rows = []
    for index, turn in enumerate(turns):
        plan = _plan(turns, index, layout, geometry)
        prompt = _render(turns, index, layout, plan)
        cached_blocks = 0
        for block_hash in _block_hashes(prompt[:-1], geometry.block_size):
            if block_hash not in cache:
                break
            cached_blocks += 1
        generated = _message_tokens(f"answer-{index}",
                                    turn.answer_tokens - layout.generation_header_tokens)
        cache.update(_block_hashes([*prompt, *generated[:-1]], geometry.block_size))
        new = ([turn.user_tokens] if index == 0
               else [turns[index - 1].answer_tokens, turn.user_tokens])
        rows.append({"turn": index + 1, "prompt_tokens": len(prompt),
                     "cached_tokens": cached_blocks * geometry.block_size,
                     "dropped_turns": plan.dropped_turns, "new_message_tokens": new})
    return rows


def replay_document(turns: Sequence[ChatTurn], layout: PromptLayout,
                    geometry: Geometry) -> dict[str, Any]:
    """A ``config/prefix_reuse.json``-shaped document of the simulated replay."""
    rows = simulate(turns, layout, geometry)
    window = geometry.window
    return {
        "version": 1, "status": "simulated",
        "source": "tests/capacity_model/prefix_cache_sim.py (token-level reference)",
        "engine": {"block_size": geometry.block_size,
                   "max_model_len": geometry.max_model_len, "enable_prefix_caching": True},
        "window": {"system": window.system, "rag": window.rag, "history": window.history,
                   "output": window.output, "step_turns": window.step_turns},
        "template": {"system_tokens": layout.system_tokens,
                     "opening_tokens": layout.opening_tokens,
                     "generation_header_tokens": layout.generation_header_tokens,
                     "marker_tokens": layout.marker_tokens},
        "turns": rows,
        "summary": {"prompt_tokens": sum(r["prompt_tokens"] for r in rows),
                    "cached_tokens": sum(r["cached_tokens"] for r in rows)},
    }
