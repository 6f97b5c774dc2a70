"""A long Japanese/English conversation through the real request path (tokenizer, template,
planner): system and pinned messages kept, oldest turns dropped, the marker shown, the budget
held exactly in the served model's tokens."""

from __future__ import annotations

from typing import Any

import pytest

from context_window import StepPolicy, stable_history_start
from gateway.api.errors import ApiError
from gateway.api.serving import MARKER_TEMPLATE
from gateway.tokenizer import ChatTokenizer, ChatTurn
from prompts import SYSTEM_PROMPT_JA
from tests.containers.llm.harness import chat_request, new_record
from tests.support.demo_model import synthetic_conversation

PREFERENCE = "好きなジャンルはダークファンタジーです。I never want romance recommendations."


def long_conversation(tokenizer: ChatTokenizer, turns: int = 35) -> list[dict[str, str]]:
    history = synthetic_conversation(tokenizer.tokenizer, turns=turns, tokens_per_turn=100,
                                     seed=11)
    history[2] = {"role": "user", "content": PREFERENCE}  # stated early, pinned below
    return [{"role": "system", "content": SYSTEM_PROMPT_JA}, *history]


def test_35_turn_conversation_keeps_instructions_drops_oldest_and_fits_exactly(
        make_runtime: Any, chat_tokenizer: ChatTokenizer) -> None:
    runtime, _ = make_runtime()
    messages = long_conversation(chat_tokenizer)
    request = chat_request(model="manga", messages=messages, max_tokens=256,
                           mangaassist={"pinned_messages": [3], "locale": "ja-JP"})
    prepared = runtime.service.prepare(request, new_record())
    plan = prepared.plan
    prompt = prepared.prompt

    # Kept: the system prompt, the pinned preference, the newest turns and the question.
    assert plan.kept_indices[:2] == (0, 3)
    assert plan.kept_indices[-1] == len(messages) - 1
    assert plan.truncated
    assert plan.dropped_indices == tuple(i for i in range(1, plan.dropped_indices[-1] + 1)
                                         if i != 3)
    history_kept = [i for i in plan.kept_indices if i not in (0, 3)]
    assert history_kept == list(range(history_kept[0], len(messages)))  # newest, contiguous

    # The marker is in the prompt, where the dropped turns were, with the right count.
    marker = MARKER_TEMPLATE.format(count=plan.dropped_turns)
    assert marker in prompt.text
    assert prompt.text.index(marker) < prompt.text.index(PREFERENCE) < prompt.text.index(
        messages[history_kept[0]]["content"])
    assert prepared.extension.context.truncation_notice == (
        f"以前の会話の一部（{plan.dropped_turns}件）は省略されています。")

    # Exactly inside the budget, counted with the served model's own tokenizer...
    assert list(prompt.token_ids) == chat_tokenizer.encode(prompt.text)
    assert prompt.num_tokens == plan.estimated_prompt_tokens
    assert prompt.num_tokens + 256 <= 4096
    assert plan.history_tokens <= plan.history_budget_tokens == 2048
    # ...and where the step policy puts the window for these messages' real sizes.
    history = [i for i in range(1, len(messages) - 1) if i != 3]
    sizes = [chat_tokenizer.count([messages[i]["content"]])[0]
             + chat_tokenizer.overhead.for_role(messages[i]["role"]) for i in history]
    start = stable_history_start(sizes, StepPolicy(2048, 6))
    assert history_kept[:-1] == history[start:]


def test_every_prefix_of_a_60_turn_session_fits(make_runtime: Any,
                                                chat_tokenizer: ChatTokenizer) -> None:
    """As a session grows turn by turn, the prompt never leaves the window."""
    runtime, _ = make_runtime(ENGINE_MAX_MODEL_LEN="2048")
    messages = long_conversation(chat_tokenizer, turns=61)
    for end in range(2, len(messages) + 1, 2):
        prefix = messages[:end] if messages[end - 1]["role"] == "user" else messages[:end - 1]
        request = chat_request(messages=prefix, max_tokens=128)
        prepared = runtime.service.prepare(request, new_record())
        assert prepared.prompt.num_tokens + 128 <= 2048
        assert prepared.plan.truncated == bool(prepared.plan.dropped_indices)
        assert list(prepared.prompt.token_ids) == chat_tokenizer.encode(prepared.prompt.text)


def test_rag_chunks_are_trimmed_but_the_question_stays(make_runtime: Any,
                                                       chat_tokenizer: ChatTokenizer) -> None:
    runtime, _ = make_runtime(ENGINE_MAX_MODEL_LEN="1024")
    question = " ".join(m["content"] for m in synthetic_conversation(
        chat_tokenizer.tokenizer, turns=5, tokens_per_turn=100, seed=2))
    chunks = [m["content"] for m in synthetic_conversation(
        chat_tokenizer.tokenizer, turns=8, tokens_per_turn=90, seed=3)]
    request = chat_request(messages=[{"role": "user", "content": question}], max_tokens=64,
                           mangaassist={"rag_context": chunks})
    prepared = runtime.service.prepare(request, new_record())
    assert question in prepared.prompt.text
    assert 0 < prepared.plan.rag_chunks_kept < len(chunks)
    assert chunks[0] in prepared.prompt.text  # best-ranked first
    assert chunks[-1] not in prepared.prompt.text
    assert prepared.prompt.num_tokens + 64 <= 1024


def test_a_question_that_alone_cannot_fit_is_a_400(make_runtime: Any,
                                                   chat_tokenizer: ChatTokenizer) -> None:
    runtime, _ = make_runtime(ENGINE_MAX_MODEL_LEN="512")
    huge = " ".join(m["content"] for m in synthetic_conversation(
        chat_tokenizer.tokenizer, turns=9, tokens_per_turn=100, seed=4))
    with pytest.raises(ApiError) as caught:
        runtime.service.prepare(chat_request(messages=[{"role": "user", "content": huge}]),
                                new_record())
    assert caught.value.status == 400
    assert caught.value.param == "messages[0].content"
    assert caught.value.code == "context_length_exceeded"
    assert "the current message needs" in caught.value.message


def test_breaker_open_shrinks_the_context(make_runtime: Any,
                                          chat_tokenizer: ChatTokenizer) -> None:
    runtime, lines = make_runtime()
    request = chat_request(messages=long_conversation(chat_tokenizer), max_tokens=64)
    normal = runtime.service.prepare(request, new_record())
    runtime.breaker.record_trip(runtime.clock(), "test")
    tight = runtime.service.prepare(request, new_record())
    assert tight.context_factor == 0.5
    assert tight.plan.history_budget_tokens == normal.plan.history_budget_tokens // 2
    assert tight.prompt.num_tokens < normal.prompt.num_tokens
    assert tight.extension.breaker == "open"
    assert any('"to_state":"open"' in line for line in lines)  # the BreakerState event line


def test_developer_role_renders_as_system(make_runtime: Any) -> None:
    runtime, _ = make_runtime()
    request = chat_request(messages=[{"role": "developer", "content": "Be brief."},
                                     {"role": "user", "content": "  Naruto?  "}])
    prepared = runtime.service.prepare(request, new_record())
    expected = runtime.tokenizer.render_text([ChatTurn("system", "Be brief."),
                                              ChatTurn("user", "Naruto?")])
    assert prepared.prompt.text == expected
