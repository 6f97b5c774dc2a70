"""At engine start the gateway checks its prompt rendering against the engine tokenizer's own
``apply_chat_template`` (a real transformers tokenizer here) and never keeps serving a rendering
the model was not trained on."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from gateway.engines.vllm import token_ids_of
from gateway.rendering import PROBE_CONVERSATIONS, PromptRendering, check_rendering
from gateway.tokenizer import ChatTokenizer, ChatTurn
from tests.containers.llm.harness import chat_request, new_record


def hf_renderer(model_dir: Path, *, template: str | None = None) -> Any:
    """What the vLLM adapter's chat_renderer does, on a real transformers tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if template is not None:
        tokenizer.chat_template = template

    def render(messages: Sequence[Mapping[str, str]]) -> list[int]:
        return token_ids_of(tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=True, add_generation_prompt=True))

    return render


class RenderingEngine:
    """An engine whose tokenizer renders with ``render`` (or fails with ``error``)."""

    name = "rendering"

    def __init__(self, render: Any = None, error: Exception | None = None) -> None:
        self.render, self.error = render, error

    def chat_renderer(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.render


def events(lines: list[str], name: str) -> list[dict[str, Any]]:
    return [record for record in map(json.loads, lines) if record.get("event") == name]


@pytest.fixture
def fresh_tokenizer(demo_model_dir: Path) -> ChatTokenizer:
    return ChatTokenizer.from_model_dir(demo_model_dir)


def test_the_same_template_matches_on_every_probe(fresh_tokenizer: ChatTokenizer,
                                                  demo_model_dir: Path) -> None:
    check = check_rendering(fresh_tokenizer, hf_renderer(demo_model_dir))
    assert check.matches
    assert check.mode is PromptRendering.ASSEMBLED
    assert check.detail == f"{len(PROBE_CONVERSATIONS)} probe conversations identical"


def test_an_assembly_that_differs_falls_back_to_the_whole_text(
        fresh_tokenizer: ChatTokenizer, demo_model_dir: Path) -> None:
    """The engine tokenizer renders the same text but tokenizes it whole; the gateway's
    per-message assembly gives other ids on one probe (simulated by a segment cache entry that
    is wrong, as a tokenizer merging across a template boundary would make it)."""
    fresh_tokenizer.render_prompt([ChatTurn(role, content)
                                   for role, content in PROBE_CONVERSATIONS[0]])
    for literal, ids in list(fresh_tokenizer._segment_ids.items()):
        if "user<|end_header_id|>" in literal:
            fresh_tokenizer._segment_ids[literal] = ids[::-1]
    check = check_rendering(fresh_tokenizer, hf_renderer(demo_model_dir))
    assert not check.matches
    assert check.mode is PromptRendering.WHOLE_TEXT
    assert check.probe == 0
    assert "per-message assembly is off" in check.detail


def test_a_template_the_gateway_does_not_reproduce_makes_the_engine_render(
        fresh_tokenizer: ChatTokenizer, demo_model_dir: Path) -> None:
    other = AutoTokenizer.from_pretrained(str(demo_model_dir)).chat_template.replace(
        "<|eot_id|>", "\n<|eot_id|>")
    check = check_rendering(fresh_tokenizer, hf_renderer(demo_model_dir, template=other))
    assert not check.matches
    assert check.mode is PromptRendering.ENGINE_TOKENIZER
    assert check.gateway_tokens is not None and check.engine_tokens is not None
    assert check.engine_tokens > check.gateway_tokens
    assert fresh_tokenizer.reference is None, "checking does not switch; applying does"


def test_the_runtime_switches_to_the_engine_rendering_and_says_so(
        make_runtime: Any, demo_model_dir: Path, chat_tokenizer: ChatTokenizer) -> None:
    other = AutoTokenizer.from_pretrained(str(demo_model_dir)).chat_template.replace(
        "<|eot_id|>", "\n<|eot_id|>")
    reference = hf_renderer(demo_model_dir, template=other)
    runtime, lines = make_runtime()
    try:
        runtime.events.check_chat_rendering(RenderingEngine(reference))
        (record,) = events(lines, "chat_template_check")
        assert record["level"] == "warning"
        assert record["matches"] is False
        assert record["mode"] == "engine_tokenizer"
        assert runtime.events.rendering["mode"] == "engine_tokenizer"
        assert json.loads(runtime.ping().body)["prompt_rendering"]["mode"] == "engine_tokenizer"
        messages = [{"role": "system", "content": "You are MangaAssist."},
                    {"role": "user", "content": "  鬼滅の刃に似たマンガは？ 🙂 "}]
        prepared = runtime.service.prepare(chat_request(messages=messages, max_tokens=8),
                                           new_record())
        assert list(prepared.prompt.token_ids) == reference(messages)
    finally:
        chat_tokenizer.reference = None  # the session's shared tokenizer


def test_a_matching_engine_keeps_the_fast_path_and_ping_says_verified(
        make_runtime: Any, demo_model_dir: Path) -> None:
    runtime, lines = make_runtime()
    assert json.loads(runtime.ping().body)["prompt_rendering"]["verified"] is False
    runtime.events.check_chat_rendering(RenderingEngine(hf_renderer(demo_model_dir)))
    (record,) = events(lines, "chat_template_check")
    assert record["matches"] is True
    assert json.loads(runtime.ping().body)["prompt_rendering"] == {
        "mode": "assembled", "verified": True,
        "detail": f"{len(PROBE_CONVERSATIONS)} probe conversations identical"}


def test_a_failing_check_is_reported_and_shown_as_unverified(make_runtime: Any) -> None:
    runtime, lines = make_runtime()
    runtime.events.check_chat_rendering(RenderingEngine(error=RuntimeError("no chat template")))
    (record,) = events(lines, "chat_template_check_failed")
    assert "no chat template" in record["error"]
    rendering = json.loads(runtime.ping().body)["prompt_rendering"]
    assert rendering["verified"] is False
    assert "no chat template" in rendering["detail"]


def test_engines_without_rendering_are_not_checked(make_runtime: Any) -> None:
    runtime, lines = make_runtime()
    runtime.events.check_chat_rendering(object())
    assert not events(lines, "chat_template_check")


def test_the_probes_are_conversations_the_gateway_sends(chat_tokenizer: ChatTokenizer) -> None:
    """Trimmed contents (the template trims too), roles the templates know, and the system
    messages the gateway inserts itself."""
    from gateway.api.serving import MARKER_TEMPLATE, RAG_HEADER

    for conversation in PROBE_CONVERSATIONS:
        assert all(content == content.strip() for _, content in conversation)
        assert {role for role, _ in conversation} <= {"system", "user", "assistant"}
        chat_tokenizer.render_prompt([ChatTurn(role, content) for role, content in conversation])
    contents = [content for conversation in PROBE_CONVERSATIONS for _, content in conversation]
    assert any(content.startswith(RAG_HEADER) for content in contents)
    marker_prefix = MARKER_TEMPLATE.split("{")[0]
    assert any(content.startswith(marker_prefix) for content in contents)
