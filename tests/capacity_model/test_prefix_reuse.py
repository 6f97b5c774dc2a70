"""Prefix reuse predicted from the window geometry: by hand, against a token-level reference of
vLLM's block-hash cache driven by the gateway's own context budget, against the production
conversation, and against the replay measured on the real engine."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capacity_model import ContextWindow
from capacity_model.demand import DemandError
from capacity_model.prefix_reuse import (
    ChatTurn,
    Geometry,
    PromptLayout,
    cached_prefix,
    compare_with_measured,
    measured_inputs,
    replay,
    summarize,
    uniform_turns,
)
from gateway.context_budget import BudgetError
from stacks.settings import REPO_ROOT
from tests.capacity_model.prefix_cache_sim import replay_document, simulate

MEASURED = REPO_ROOT / "config" / "prefix_reuse.json"
SEED_WINDOW = ContextWindow(system=0.125, rag=0.25, history=0.5, output=0.125, step_turns=6)


def test_the_cache_serves_whole_blocks_of_the_common_prefix_never_the_last_token() -> None:
    prompt = [("a", 10), ("b", 7), ("c", 5)]
    assert cached_prefix(prompt, [("a", 10), ("b", 7), ("x", 9)], 26, 4) == 16  # 17 → 16
    assert cached_prefix(prompt, [("a", 10), ("b", 7), ("c", 5), ("d", 3)], 25, 4) == 20
    assert cached_prefix(prompt, prompt, 22, 1) == 21  # the last prompt token is recomputed
    assert cached_prefix(prompt, [("a", 10), ("b", 7)], 12, 4) == 12  # only what was computed
    assert cached_prefix(prompt, [("z", 10)], 10, 4) == 0


def test_between_steps_a_turn_reuses_the_previous_prompt_and_answer() -> None:
    """No retrieved context, nothing truncated: turn 2's prompt is turn 1's prompt + its answer
    + the new message, and the engine computed turn 1's prompt + all but the last generated
    token: (1 + 30 + 10 + 4) + (12 − 4) − 1 = 52 tokens → 48 in 16-token blocks."""
    layout = PromptLayout(system_tokens=30, opening_tokens=1, generation_header_tokens=4,
                          marker_tokens=5)
    geometry = Geometry(max_model_len=4096, window=SEED_WINDOW, block_size=16)
    first, second = replay([ChatTurn(10, 12), ChatTurn(9, 12)], layout, geometry,
                           shared_system=False)
    assert (first.prompt_tokens, first.cached_tokens) == (45, 0)
    assert second.prompt_tokens == 45 + 12 + 9
    assert second.cached_tokens == 48
    assert second.system_cached_tokens == 16  # 31 tokens of opening + system → one block
    assert not first.step and not second.step


def test_retrieved_context_before_the_message_costs_the_last_exchange() -> None:
    """With retrieved context on every turn the previous prompt diverges at its own retrieved
    context: turn 3 reuses turn 2's prompt only up to turn 2's message."""
    layout = PromptLayout(system_tokens=31, opening_tokens=1, generation_header_tokens=4,
                          marker_tokens=5)
    geometry = Geometry(max_model_len=4096, window=SEED_WINDOW, block_size=16)
    turns = [ChatTurn(20, 20, 100)] * 3
    results = replay(turns, layout, geometry)
    # turn 3: opening + system + user1 + answer1 = 32 + 40 = 72 tokens in common → 64.
    assert results[2].cached_tokens == 64
    assert results[2].prefilled_tokens == results[2].prompt_tokens - 64


conversations = st.lists(
    st.builds(ChatTurn, user_tokens=st.integers(5, 200), answer_tokens=st.integers(6, 300),
              rag_tokens=st.sampled_from([0, 0, 64, 300])),
    min_size=1, max_size=40)
geometries = st.builds(
    Geometry, max_model_len=st.sampled_from([1024, 2048, 4096]),
    window=st.builds(ContextWindow, system=st.just(0.125), rag=st.sampled_from([0.125, 0.25]),
                     history=st.sampled_from([0.25, 0.5]), output=st.just(0.125),
                     step_turns=st.integers(1, 8)),
    block_size=st.sampled_from([16, 32]))


@settings(max_examples=150, deadline=None)
@given(turns=conversations, geometry=geometries, system=st.integers(0, 120))
def test_the_prediction_is_what_the_gateway_and_vllms_block_cache_do(
        turns: list[ChatTurn], geometry: Geometry, system: int) -> None:
    """Random conversations: per turn the same prompt size, the same dropped messages (the
    gateway's ``plan_context``) and the same cached tokens as real token lists hashed block by
    block (tests/capacity_model/prefix_cache_sim.py)."""
    layout = PromptLayout(system_tokens=system, opening_tokens=1, generation_header_tokens=4,
                          marker_tokens=12)
    try:
        reference = simulate(turns, layout, geometry)
    except BudgetError:  # the gateway refuses a turn (400): the model refuses it too
        with pytest.raises(DemandError):
            replay(turns, layout, geometry, shared_system=False)
        return
    predicted = replay(turns, layout, geometry, shared_system=False)
    assert [(p.prompt_tokens, p.cached_tokens, p.dropped_messages) for p in predicted] == [
        (r["prompt_tokens"], r["cached_tokens"], r["dropped_turns"]) for r in reference]


def test_the_production_conversation_reuses_most_of_its_history_between_steps() -> None:
    """Seed 001's conversation on the production window: 512 system, 1,024 retrieved, 100-token
    messages. Every turn prefills its retrieved context, its message and the previous
    exchange; a step (every ~6 turns once the history is full) prefills all but the system
    prompt. The history share is 2,048 but beside 512 + 1,024 + the marker only 2,028 fit: the
    window's high-water mark is that room, for history and question together, so no turn
    between steps is trimmed (it once was: steps at turns 11, 12, 18, 24 and 25, 69.8 %)."""
    geometry = Geometry(max_model_len=4096, window=SEED_WINDOW, block_size=16)
    layout = PromptLayout(system_tokens=512, opening_tokens=1, generation_header_tokens=4,
                          marker_tokens=20)
    results = replay(uniform_turns(30, user_tokens=100, answer_tokens=100, rag_tokens=1024),
                     layout, geometry)
    summary = summarize(results)
    assert [r.turn for r in results if r.step] == [11, 18, 24]
    assert [r.dropped_messages for r in results if r.step] == [13, 26, 39]
    for turn in (r for r in results if not r.step and r.turn > 1):
        assert turn.prefilled_tokens <= 100 + 100 + 1024 + 100 + 4 + 16
    assert all(r.cached_tokens == r.system_cached_tokens == 512 for r in results if r.step)
    # Turn 3 by hand: 513 + 2 × 200 + 1,024 + 100 + 4 = 2,041 tokens; in common with turn 2:
    # opening + system + the first exchange = 713 → 704 in 16-token blocks.
    assert (results[2].prompt_tokens, results[2].cached_tokens) == (2041, 704)
    assert summary.history_reuse == pytest.approx(27824 / 35400)  # 0.786
    assert summary.cached_share == pytest.approx(43184 / 84630)


def test_the_simulated_replay_file_is_predicted_exactly() -> None:
    """The comparison code on a file in the measured format (here the token-level reference
    of a 40-turn chat: 1,024-token window, 32-token blocks, answers sent back as generated)."""
    geometry = Geometry(max_model_len=1024, window=SEED_WINDOW, block_size=32, max_tokens=64)
    layout = PromptLayout(system_tokens=40, opening_tokens=1, generation_header_tokens=4,
                          marker_tokens=14)
    conversation = [ChatTurn(18 + (i % 3) * 7, 40 + (i % 5) * 6) for i in range(40)]
    document = json.loads(json.dumps(replay_document(conversation, layout, geometry)))
    for row in document["turns"]:  # the file holds content tokens: take the overheads off
        row["new_message_tokens"] = [row["new_message_tokens"][0] - 5,
                                     row["new_message_tokens"][-1] - 3]
    document["turns"][0]["new_message_tokens"] = [40 - 2, conversation[0].user_tokens - 3]
    turns, read_geometry = measured_inputs(document, system_overhead=2, user_overhead=3,
                                           answer_overhead=5, layout=layout, max_tokens=64)
    assert read_geometry == geometry
    assert turns[:-1] == conversation[:-1]
    rows = compare_with_measured(document, turns, layout, geometry, answers_as_generated=True)
    assert len(rows) == 40
    assert all(r.error_tokens == 0 and r.dropped_turns == r.predicted_dropped_turns
               for r in rows)


@pytest.fixture(scope="module")
def measured() -> dict[str, Any]:
    return json.loads(MEASURED.read_text(encoding="utf-8"))


def served_layout(document: dict[str, Any]) -> tuple[PromptLayout, dict[str, int], int]:
    """The template's token costs, measured with the gateway's own tokenizer on the tiny model
    the benchmark served (tests/support/tiny_llama.py): fixed tokens (BOS + the assistant header),
    each role's overhead, the marker's size for each count."""
    from gateway.api.serving import MARKER_TEMPLATE
    from gateway.tokenizer import ChatTokenizer
    from tests.support.tiny_llama import cached_model_dir

    model_dir = cached_model_dir(REPO_ROOT / ".cache" / "fixtures",
                                 max_position_embeddings=max(
                                     4096, document["engine"]["max_model_len"]))
    tokenizer = ChatTokenizer.from_model_dir(model_dir)
    overhead = tokenizer.overhead
    roles = {role: overhead.for_role(role) for role in ("system", "user", "assistant")}
    header = roles["assistant"] - 1  # the assistant header; its end-of-turn token closes it
    layout = PromptLayout(
        system_tokens=document["turns"][0]["new_message_tokens"][0] + roles["system"],
        opening_tokens=overhead.fixed_tokens - header, generation_header_tokens=header,
        marker_tokens_for=lambda n: tokenizer.count([MARKER_TEMPLATE.format(count=n)])[0]
        + roles["system"])
    max_tokens = int(re.search(r"--max-tokens (\d+)", document["source"]).group(1))  # type: ignore[union-attr]
    return layout, roles, max_tokens


def test_the_prediction_matches_the_replay_measured_on_the_real_engine(
        measured: dict[str, Any]) -> None:
    """config/prefix_reuse.json: 40 turns through the gateway on vLLM's CPU build, prefix
    caching on. The benchmark sends back scripted answers, not what the tiny random model
    generated, so the engine's blocks of an answer match nothing. Tolerance: one KV block per
    turn, 2 % of the cached tokens in total; the window's decisions (dropped messages) exact."""
    assert measured["status"] == "measured"
    layout, roles, max_tokens = served_layout(measured)
    turns, geometry = measured_inputs(measured, system_overhead=roles["system"],
                                      user_overhead=roles["user"],
                                      answer_overhead=roles["assistant"], layout=layout,
                                      max_tokens=max_tokens)
    rows = compare_with_measured(measured, turns, layout, geometry, answers_as_generated=False)
    block = geometry.block_size
    assert [r.predicted_prompt_tokens for r in rows] == [r.prompt_tokens for r in rows]
    assert [r.predicted_dropped_turns for r in rows] == [r.dropped_turns for r in rows]
    assert all(abs(r.error_tokens) <= block for r in rows), [
        (r.turn, r.measured_cached_tokens, r.predicted_cached_tokens) for r in rows
        if abs(r.error_tokens) > block]
    measured_total = sum(r.measured_cached_tokens for r in rows)
    predicted_total = sum(r.predicted_cached_tokens for r in rows)
    assert abs(predicted_total - measured_total) <= 0.02 * measured_total
