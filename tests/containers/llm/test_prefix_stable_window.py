"""The sliding window through the real request path (tokenizer, chat template, planner): between
two steps of the window, each request's prompt — its token ids, as the engine receives them — is
the previous request's prompt plus the new messages, so the engine's prefix cache serves all of it
but those (docs/design-decisions.md#prefix-stable-window). Every other guarantee of the window
holds on every turn."""

from __future__ import annotations

import itertools
import random
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway.api.serving import MARKER_TEMPLATE, RAG_HEADER
from gateway.tokenizer import ChatTokenizer
from prompts import MANGA_CORPUS_EN, MANGA_CORPUS_JA, SYSTEM_PROMPT_EN
from tests.containers.llm.harness import chat_request, new_record


def message(rng: random.Random, sentences: int, index: int) -> str:
    pool = MANGA_CORPUS_JA if rng.random() < 0.5 else MANGA_CORPUS_EN
    return f"({index}) " + " ".join(rng.choice(pool) for _ in range(sentences))


def chat(seed: int, turns: int, low: int, high: int) -> list[dict[str, str]]:
    """A system prompt, then ``turns`` user/assistant exchanges of low-high sentences each."""
    rng = random.Random(seed)
    messages = [{"role": "system", "content": SYSTEM_PROMPT_EN}]
    for index in range(2 * turns):
        messages.append({"role": "user" if index % 2 == 0 else "assistant",
                         "content": message(rng, rng.randint(low, high), index)})
    return messages


def requests_of(messages: list[dict[str, str]]) -> list[list[dict[str, str]]]:
    """Each request the conversation sent: everything up to one of its user messages."""
    return [messages[:end + 1] for end, m in enumerate(messages) if m["role"] == "user"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                    HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), turns=st.integers(8, 40), low=st.integers(1, 3),
       spread=st.integers(0, 3), max_tokens=st.sampled_from([64, 256]),
       pin=st.booleans())
@example(seed=11, turns=40, low=2, spread=2, max_tokens=64, pin=True)
def test_each_turn_extends_the_previous_prompt_except_where_the_window_steps(
        make_runtime: Any, chat_tokenizer: ChatTokenizer, seed: int, turns: int, low: int,
        spread: int, max_tokens: int, pin: bool) -> None:
    runtime, _ = make_runtime(ENGINE_MAX_MODEL_LEN="2048")
    conversation = chat(seed, turns, low, low + spread)
    previous = None
    stable = steps = 0
    for messages in requests_of(conversation):
        pinned = [1] if pin and len(messages) > 2 else []
        prepared = runtime.service.prepare(
            chat_request(messages=messages, max_tokens=max_tokens,
                         mangaassist={"pinned_messages": pinned}), new_record())
        plan, prompt = prepared.plan, prepared.prompt
        # Every guarantee of the window, on every turn.
        assert {0, len(messages) - 1, *pinned} <= set(plan.kept_indices)
        assert prompt.num_tokens + max_tokens <= 2048
        assert plan.history_tokens <= plan.history_budget_tokens
        marker = MARKER_TEMPLATE.format(count=plan.dropped_turns)
        assert (marker in prompt.text) == plan.truncated
        if previous is not None and previous.plan.truncated:
            ids, before = list(prompt.token_ids), list(previous.prompt.token_ids)
            if plan.dropped_indices == previous.plan.dropped_indices:
                stable += 1
                assert ids[:len(before)] == before  # the previous prompt, then the new turn
            else:
                steps += 1
                assert len(plan.dropped_indices) > len(previous.plan.dropped_indices)
        previous = prepared
    assert steps <= stable + 1  # a step is the exception
    if turns == 40 and low == 2:  # the explicit example: long enough to step twice
        assert steps >= 2 and stable >= 10


def test_retrieved_context_stays_right_before_the_newest_message(
        make_runtime: Any) -> None:
    """With retrieved passages, the prompt up to them is the previous prompt up to its own:
    only the passages, the previous question and answer and the new question are new."""
    runtime, _ = make_runtime(ENGINE_MAX_MODEL_LEN="2048")
    conversation = chat(7, 30, 2, 3)
    rag = ["One Piece volume 107 ships on 4 March.", "Chainsaw Man part 2 is ongoing."]
    prompts = []
    for messages in requests_of(conversation):
        prepared = runtime.service.prepare(chat_request(
            messages=messages, max_tokens=64, mangaassist={"rag_context": rag}), new_record())
        text = prepared.prompt.text
        assert text.index(RAG_HEADER) < text.index(messages[-1]["content"])
        assert text.index(RAG_HEADER) > text.index(messages[-2]["content"])
        prompts.append((prepared.plan, text[:text.index(RAG_HEADER)]))
    stable = [(a, b) for a, b in itertools.pairwise(prompts)
              if a[0].truncated and a[0].dropped_indices == b[0].dropped_indices]
    assert len(stable) >= 5
    for (_, before), (_, after) in stable:
        assert after.startswith(before.rsplit("<|start_header_id|>user", 1)[0])
