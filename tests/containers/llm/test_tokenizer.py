"""The served model's tokenizer: template rendering, exact fast assembly, the bounded cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gateway.tokenizer import (
    ChatTemplateError,
    ChatTokenizer,
    ChatTurn,
    ModelDirError,
    TokenCache,
)
from prompts import SYSTEM_PROMPT_JA
from tests.support.demo_model import synthetic_conversation


def turns_of(messages: list[dict[str, str]]) -> list[ChatTurn]:
    return [ChatTurn(m["role"], m["content"]) for m in messages]


def test_llama3_template_is_verified_for_fast_assembly(chat_tokenizer: ChatTokenizer) -> None:
    assert chat_tokenizer.segmented
    assert chat_tokenizer.template_source == "tokenizer_config.json"
    overhead = chat_tokenizer.overhead
    # <|start_header_id|> role <|end_header_id|> \n \n ... <|eot_id|>: 5 tokens + the role's.
    assert overhead.per_message_tokens["user"] == 5 + len(chat_tokenizer.encode("user"))
    assert overhead.fixed_tokens == 1 + 4 + len(chat_tokenizer.encode("assistant"))  # BOS + prompt


@pytest.mark.parametrize("turns", [1, 5, 31, 60])
def test_assembled_prompt_equals_whole_tokenization(chat_tokenizer: ChatTokenizer,
                                                    turns: int) -> None:
    messages = [{"role": "system", "content": SYSTEM_PROMPT_JA},
                *synthetic_conversation(chat_tokenizer.tokenizer, turns=turns, seed=turns)]
    prompt = chat_tokenizer.render_prompt(turns_of(messages))
    text = chat_tokenizer.render_text(turns_of(messages))
    assert prompt.text == text
    assert list(prompt.token_ids) == chat_tokenizer.encode(text)
    assert text.startswith("<|begin_of_text|><|start_header_id|>system")
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_token_counts_come_from_the_cache_the_second_time(demo_model_dir: Path) -> None:
    tokenizer = ChatTokenizer.from_model_dir(demo_model_dir)
    contents = [m["content"] for m in synthetic_conversation(tokenizer.tokenizer, turns=20)]
    first = tokenizer.count(contents)
    misses = tokenizer.cache.misses
    assert tokenizer.count(contents) == first
    assert tokenizer.cache.misses == misses
    assert tokenizer.cache.hits >= 20
    assert first == [len(tokenizer.encode(text)) for text in contents]


def test_cache_is_bounded_in_tokens() -> None:
    cache = TokenCache(max_tokens=100)
    from array import array
    for index in range(50):
        cache.put(f"message {index}", array("i", range(10)))
    assert cache.cached_tokens <= 100
    assert len(cache) == 10
    assert cache.get("message 49") is not None
    assert cache.get("message 0") is None
    cache.put("huge", array("i", range(500)))  # larger than the bound: not cached at all
    assert cache.get("huge") is None
    assert cache.cached_tokens <= 100


def test_template_that_glues_content_falls_back_to_whole_tokenization(
        demo_model_dir: Path, tmp_path: Path) -> None:
    """'User: ' + content merges the space into the content's first token: not segmentable."""
    model_dir = tmp_path / "model"
    shutil.copytree(demo_model_dir, model_dir)
    (model_dir / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}", encoding="utf-8")
    tokenizer = ChatTokenizer.from_model_dir(model_dir)
    assert tokenizer.template_source.endswith("chat_template.jinja")  # preferred over the config
    assert not tokenizer.segmented
    turns = [ChatTurn("user", "One Piece 1巻"), ChatTurn("assistant", "ありがとうございます")]
    prompt = tokenizer.render_prompt(turns)
    assert list(prompt.token_ids) == tokenizer.encode(prompt.text)


def test_template_errors_become_chat_template_errors(demo_model_dir: Path,
                                                     tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(demo_model_dir, model_dir)
    config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = (
        "{% for m in messages %}{% if m['role'] == 'assistant' and loop.first %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}")
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    tokenizer = ChatTokenizer.from_model_dir(model_dir)
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        tokenizer.render_prompt([ChatTurn("assistant", "hi"), ChatTurn("user", "yo")])


def test_missing_tokenizer_names_the_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelDirError, match=r"GATEWAY_MODEL_DIR=.*no tokenizer\.json"):
        ChatTokenizer.from_model_dir(tmp_path)


def test_directory_without_template_uses_the_fallback(demo_model_dir: Path,
                                                      tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    shutil.copy(demo_model_dir / "tokenizer.json", model_dir / "tokenizer.json")
    tokenizer = ChatTokenizer.from_model_dir(model_dir)
    assert tokenizer.template_source == "fallback"
    prompt = tokenizer.render_prompt([ChatTurn("user", "Naruto?")])
    assert prompt.text == "user: Naruto?\n\nassistant: "
    assert list(prompt.token_ids) == tokenizer.encode(prompt.text)
