"""The request mix and the long conversation: checked against request_buckets and the gateway."""

from __future__ import annotations

import pytest

from capacity_model import (
    BucketDemand,
    ContextWindow,
    Conversation,
    DemandError,
    request_mix,
    size_conversation,
)
from gateway.context_budget import BudgetMessage, plan_context
from gateway.settings import ContextSplit
from gateway.settings import load_settings as gateway_settings
from request_buckets import RequestBucket, bucket_bounds

BOUNDS = bucket_bounds(4096)
SEED_WINDOW = ContextWindow(system=0.125, rag=0.25, history=0.5, output=0.125)
S, M, L, XL = RequestBucket.S, RequestBucket.M, RequestBucket.L, RequestBucket.XL


def demands(**shares: float) -> list[BucketDemand]:
    typical = {S: (200, 256, 90), M: (350, 512, 160), L: (1000, 512, 220), XL: (2900, 512, 260)}
    return [BucketDemand(RequestBucket(name), share, *typical[RequestBucket(name)])
            for name, share in shares.items()]


def test_means_are_share_weighted_and_reservations_whole_blocks() -> None:
    mix = request_mix(demands(S=0.1, M=0.45, L=0.3, XL=0.15), BOUNDS)
    assert mix.mean_prompt_tokens == pytest.approx(0.1 * 200 + 0.45 * 350 + 0.3 * 1000
                                                   + 0.15 * 2900)
    assert mix.mean_output_tokens == pytest.approx(0.1 * 90 + 0.45 * 160 + 0.3 * 220
                                                   + 0.15 * 260)
    # 456 → 29 blocks, 862 → 54, 1,512 → 95, 3,412 → 214 (16-token blocks, rounded up)
    assert mix.mean_reserved_blocks(16) == pytest.approx(0.1 * 29 + 0.45 * 54 + 0.3 * 95
                                                         + 0.15 * 214)
    assert mix.share_of("XL") == 0.15
    assert request_mix(demands(M=1.0), BOUNDS).share_of(S) == 0


@pytest.mark.parametrize(("entries", "message"), [
    (demands(S=0.5, M=0.4), "shares add up to 0.9; accepted: 1"),
    ([BucketDemand(S, 1.0, 400, 256, 90)],
     "S: prompt_tokens + max_tokens = 656 is bucket M, not S; accepted: S ≤ 512 tokens"),
    ([BucketDemand(M, 1.0, 350, 512, 600)],
     "M.output_tokens: 600 exceeds max_tokens 512; accepted: at most max_tokens"),
    ([BucketDemand(XL, 1.0, 4000, 512, 200)],
     "XL: prompt_tokens + max_tokens = 4,512 exceeds max_model_len 4,096"),
    ([*demands(M=0.5), *demands(M=0.5)], "M: appears twice"),
    ([BucketDemand(M, -0.1, 350, 512, 100), *demands(L=1.1)], "M.share: -0.1; accepted: 0 to 1"),
    ([], "no bucket given"),
])
def test_a_bad_mix_names_the_bucket(entries: list[BucketDemand], message: str) -> None:
    with pytest.raises(DemandError) as info:
        request_mix(entries, BOUNDS)
    assert message in str(info.value)


def test_the_window_is_the_gateways_context_split() -> None:
    window = ContextWindow(system=0.1, rag=0.2, history=0.45, output=0.0625)
    split = gateway_settings({"GATEWAY_CONTEXT_SPLIT": window.as_env(),
                              "GATEWAY_ENGINE": "sim"}).gateway.context_split
    assert (split.system, split.rag, split.history, split.output) == (0.1, 0.2, 0.45, 0.0625)
    assert window.default_max_tokens(4096) == 256
    with pytest.raises(DemandError, match=r"shares add up to 1\.1"):
        ContextWindow(system=0.5, rag=0.3, history=0.2, output=0.1)


@pytest.mark.parametrize(("window", "turns"), [
    (SEED_WINDOW, 30), (SEED_WINDOW, 8), (ContextWindow(0.125, 0.25, 0.25, 0.125), 30),
    (ContextWindow(0.125, 0.25, 0.5, 0.0625), 30), (ContextWindow(0.05, 0.1, 0.5, 0.125), 60),
])
def test_a_conversation_is_sized_as_the_gateways_context_budget_sizes_it(
    window: ContextWindow, turns: int,
) -> None:
    """The capacity model's conversation is the largest request the gateway's own plan
    (plan_context) makes of it on any of its turns — what the KV pool must hold: system prompt,
    messages of 100 tokens, the retrieved context. The stepped window reaches that size on the
    turn before a step (docs/design-decisions.md#prefix-stable-window)."""
    conversation = Conversation(turns=turns, tokens_per_turn=100, system_tokens=200,
                                rag_tokens=1024, rag_chunks=4)
    sized = size_conversation(conversation, window, BOUNDS)
    max_tokens = window.default_max_tokens(4096)
    messages = [BudgetMessage(0, "system", 200),
                *(BudgetMessage(i + 1, "user" if i % 2 == 0 else "assistant", 100)
                  for i in range(turns))]
    plans = [plan_context(messages[:end], max_model_len=4096, max_output_tokens=max_tokens,
                          split=ContextSplit(window.system, window.rag, window.history,
                                             window.output),
                          fixed_overhead_tokens=0, marker_tokens=lambda n: 0,
                          step_turns=window.step_turns, rag_chunk_tokens=[256] * 4)
             for end in {*range(2, turns + 1, 2), turns + 1}]  # each request of the chat
    largest = max(plans, key=lambda plan: plan.estimated_prompt_tokens)
    assert sized.max_tokens == max_tokens
    assert sized.prompt_tokens == largest.estimated_prompt_tokens
    kept_history = len(largest.kept_indices) - 2  # less the system prompt and the question
    assert sized.turns_kept - 1 == kept_history


def test_seed_001s_thirty_turn_chat_fills_the_window_and_is_xl() -> None:
    sized = size_conversation(Conversation(30, 100, 512, 1024), SEED_WINDOW, BOUNDS)
    # 512 system + 100 current + 1,024 retrieved + 18 earlier turns (history and question
    # reach the 2,048-token high-water mark on the request before a step; requests come every
    # two messages) = 3,436 prompt tokens, + 512 max_tokens = 3,948: XL.
    assert (sized.prompt_tokens, sized.max_tokens, sized.reserved_tokens) == (3436, 512, 3948)
    assert (sized.turns_kept, sized.turns_dropped, sized.bucket) == (19, 11, XL)


def test_a_system_prompt_over_its_share_is_refused_as_the_gateway_refuses_it() -> None:
    with pytest.raises(DemandError, match=r"system_tokens: 600 exceeds the system share \(512"):
        size_conversation(Conversation(30, 100, 600, 1024), SEED_WINDOW, BOUNDS)
