"""The official openai client, unchanged, against the running gateway (stream and non-stream)."""

from __future__ import annotations

import openai
import pytest

from tests.containers.llm.harness import GatewayProcess


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="not-needed", max_retries=0)


def test_non_streaming_completion(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="manga",
        messages=[{"role": "system", "content": "You are MangaAssist."},
                  {"role": "user", "content": "鬼滅の刃に似たマンガを教えてください。"}],
        max_tokens=16, temperature=0.7, top_p=0.9, seed=7,
        extra_body={"mangaassist": {"intent": "recommendation", "locale": "ja-JP"}},
    )
    assert completion.object == "chat.completion"
    assert completion.model == "manga"  # explicit model wins over the ja-JP route
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert completion.usage is not None
    assert completion.usage.completion_tokens <= 16
    extension = completion.model_extra["mangaassist"]  # type: ignore[index]
    assert extension["adapter"] == "manga"
    assert extension["fallback"] is None


def test_streaming_completion(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="auto",
        messages=[{"role": "user", "content": "Where is my order? I bought the Berserk set."}],
        max_completion_tokens=12, stream=True, stream_options={"include_usage": True},
        extra_body={"mangaassist": {"intent": "order_tracking"}},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].model == "support"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish in (["stop"], ["length"])
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens <= 12


def test_models_list(client: openai.OpenAI) -> None:
    assert [model.id for model in client.models.list()] == [
        "mangaassist-base", "manga", "support", "manga-ja"]


def test_errors_map_to_the_clients_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o",
                                       messages=[{"role": "user", "content": "hi"}])
    assert missing.value.body["param"] == "model"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="manga", messages=[])
    assert bad.value.body["param"] == "messages"  # type: ignore[index]
