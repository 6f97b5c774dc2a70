"""Prompt identity: for every conversation the gateway accepts, the token ids it sends are the
served tokenizer's own ``apply_chat_template(messages, add_generation_prompt=True)`` ids — what
the model was trained on and what vLLM's own OpenAI server would send.

Property tests (hypothesis) on both test tokenizers — the demo tokenizer the simulated engine
serves and the tiny Llama-3 the real-engine tier serves — over roles (a system or developer
prompt, alternating turns, pinned messages), Japanese and English, emoji, odd whitespace, special
token text and long histories. When the gateway keeps the whole conversation, the ids equal the
template applied to the request's own messages; when it truncates or adds retrieved context,
they equal the template applied to the messages it sent (``PreparedChat.turns``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from gateway.api.chat_run import PreparedChat
from gateway.api.errors import ApiError
from gateway.app import GatewayRuntime
from gateway.engines.vllm import token_ids_of
from gateway.telemetry import Telemetry
from gateway.tokenizer import ChatTokenizer
from prompts import MANGA_CORPUS_EN, MANGA_CORPUS_JA
from tests.containers.llm.harness import chat_request, make_settings, new_record
from tests.support.sim_engine import from_settings
from tests.support.tiny_llama import MANGA_QA, build_tiny_llama3_tokenizer

FRAGMENTS: tuple[str, ...] = (
    *MANGA_CORPUS_EN[:8], *MANGA_CORPUS_JA[:8],
    "🙂", "📚✨", "👨‍👩‍👧", " ", "  ", "\n", "\n\n", "\t", "\u3000", "\r\n", "\u00a0", "—", "…",
    "'s", "'ll", "\"quoted\"", "34", "1巻", "x", "?", "!", "ワンピース", "<|eot_id|>",
    "<|start_header_id|>", "é", "ß", "中文", "한국어",
)


@st.composite
def contents(draw: st.DrawFn, *, max_fragments: int = 8) -> str:
    return "".join(draw(st.lists(st.sampled_from(FRAGMENTS), min_size=0,
                                 max_size=max_fragments)))


@st.composite
def conversations(draw: st.DrawFn) -> dict[str, Any]:
    """A request body: an optional system/developer prompt, alternating turns ending with the
    user's, maybe pinned messages, retrieved context and a max_tokens."""
    turns = draw(st.integers(min_value=1, max_value=40))
    long_messages = draw(st.booleans())
    messages: list[dict[str, str]] = []
    if draw(st.booleans()):
        messages.append({"role": draw(st.sampled_from(["system", "developer"])),
                         "content": draw(contents())})
    for index in range(turns):
        role = "user" if (turns - 1 - index) % 2 == 0 else "assistant"
        text = draw(contents(max_fragments=24 if long_messages else 6))
        messages.append({"role": role, "content": text})
    if not messages[-1]["content"].strip():
        messages[-1]["content"] = draw(st.sampled_from(MANGA_CORPUS_JA + MANGA_CORPUS_EN))
    body: dict[str, Any] = {"messages": messages,
                            "max_tokens": draw(st.integers(min_value=1, max_value=96))}
    extension: dict[str, Any] = {}
    earlier = len(messages) - 1
    if earlier and draw(st.booleans()):
        extension["pinned_messages"] = sorted(draw(st.sets(
            st.integers(min_value=0, max_value=earlier - 1), max_size=3)))
    if draw(st.booleans()):
        extension["rag_context"] = draw(st.lists(contents(), min_size=1, max_size=3))
    if extension:
        body["mangaassist"] = extension
    return body


def template_messages(messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    """A request's messages as the gateway renders them: the developer role is the system role
    (OpenAI's rename; Llama-3's template was trained on 'system')."""
    return [{"role": "system" if m["role"] == "developer" else m["role"],
             "content": m["content"]} for m in messages]


class Identity:
    """One tokenizer's gateway service and the transformers tokenizer it must agree with."""

    def __init__(self, model_dir: Path) -> None:
        settings_ = make_settings(model_dir, ENGINE_MAX_MODEL_LEN="1024",
                                  GATEWAY_ADAPTERS="", GATEWAY_ROUTING_TABLE="",
                                  GATEWAY_LOCALE_ROUTES="")
        self.runtime = GatewayRuntime(
            settings_, tokenizer=ChatTokenizer.from_model_dir(model_dir),
            engine_factory=lambda: from_settings(settings_),
            telemetry=Telemetry(endpoint_name="t", variant_name="v", sink=lambda line: None))
        self.hf = AutoTokenizer.from_pretrained(str(model_dir))

    def template_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        return token_ids_of(self.hf.apply_chat_template(
            [dict(m) for m in messages], tokenize=True, add_generation_prompt=True))

    def prepare(self, body: dict[str, Any]) -> PreparedChat | None:
        try:
            return self.runtime.service.prepare(chat_request(**body), new_record())
        except ApiError as error:
            if error.status != 400:  # a refusal is a client error naming the field, never more
                raise
            return None


@pytest.fixture(scope="module", params=["demo", "tiny-llama3"])
def identity(request: pytest.FixtureRequest, demo_model_dir: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Identity]:
    if request.param == "demo":
        yield Identity(demo_model_dir)
        return
    model_dir = tmp_path_factory.mktemp("tiny-llama3-tokenizer")
    build_tiny_llama3_tokenizer(MANGA_QA, model_dir)
    yield Identity(model_dir)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=conversations())
def test_the_prompt_is_the_templates_rendering_of_what_is_sent(identity: Identity,
                                                                body: dict[str, Any]) -> None:
    prepared = identity.prepare(body)
    assume(prepared is not None)
    assert prepared is not None
    sent = [{"role": turn.role, "content": turn.content} for turn in prepared.turns]
    assert list(prepared.prompt.token_ids) == identity.template_ids(sent)
    if not prepared.plan.truncated and not prepared.plan.rag_chunks_kept:
        assert list(prepared.prompt.token_ids) == identity.template_ids(
            template_messages(body["messages"]))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=conversations())
def test_a_kept_conversation_is_exactly_the_requests_messages(identity: Identity,
                                                               body: dict[str, Any]) -> None:
    body.pop("mangaassist", None)
    prepared = identity.prepare(body)
    assume(prepared is not None and not prepared.plan.truncated)
    assert prepared is not None
    assert list(prepared.prompt.token_ids) == identity.template_ids(
        template_messages(body["messages"]))
    assert prepared.record.prompt_tokens == len(prepared.prompt.token_ids)


def test_long_histories_are_truncated_and_still_identical(identity: Identity) -> None:
    """Not left to chance: a 61-message conversation overflows the 1024-token window."""
    messages = [{"role": "system", "content": "You are MangaAssist 🙂"}]
    for index in range(60):
        role = "user" if index % 2 else "assistant"
        messages.append({"role": role, "content": f"{MANGA_CORPUS_JA[index % 8]} "
                                                  f"{MANGA_CORPUS_EN[index % 8]}  "})
    prepared = identity.prepare({"messages": messages, "max_tokens": 64,
                                 "mangaassist": {"pinned_messages": [1, 2]}})
    assert prepared is not None
    assert prepared.plan.truncated
    sent = [{"role": turn.role, "content": turn.content} for turn in prepared.turns]
    assert sent[0] == {"role": "system", "content": "You are MangaAssist 🙂"}
    assert any(m["content"].startswith("[earlier conversation truncated") for m in sent)
    assert list(prepared.prompt.token_ids) == identity.template_ids(sent)
    assert len(prepared.prompt.token_ids) <= 1024 - 64
