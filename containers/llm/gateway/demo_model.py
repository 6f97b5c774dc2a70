"""A small, self-made model directory for tests, benchmarks and ``make local``.

The gateway counts tokens with the served model's own tokenizer, read from the model directory
(``tokenizer.json`` plus the chat template in ``tokenizer_config.json``). Nothing here may download
at run time, so this module *trains* a byte-level BPE tokenizer on a small manga-shop corpus with
Japanese and English text (about a second) and writes it with a Llama-3-style chat template. The
simulated engine never reads weights, so a tokenizer directory is a complete "model" for it.

Run ``python -m gateway.demo_model --out .cache/llm-demo-model`` to build one.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|eot_id|>"
SPECIAL_TOKENS: tuple[str, ...] = (
    BOS_TOKEN,
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    EOS_TOKEN,
)

LLAMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)
"""The Llama-3 instruct chat template (the shape of the model the platform serves)."""

MANGA_CORPUS_EN: tuple[str, ...] = (
    "Is One Piece volume 1 available in English?",
    "What manga series are similar to Naruto?",
    "Recommend five manga for someone who likes dark fantasy.",
    "Attack on Titan is complete in 34 volumes; the colossal edition collects them in 7.",
    "The deluxe edition of One Piece has color pages, a hardcover and a larger format.",
    "Demon Slayer follows Tanjiro Kamado, who joins the Demon Slayer Corps to save his sister.",
    "Jujutsu Kaisen volume 24 ships next Friday from the Tokyo warehouse.",
    "Frieren: Beyond Journey's End is a quiet fantasy about memory and time.",
    "Spy x Family mixes comedy, action and a found-family story.",
    "Chainsaw Man part two started serialization in Shonen Jump+.",
    "My Hero Academia ended with volume 42 in Japan.",
    "Where is my order? I bought the Berserk deluxe set last week.",
    "I would like to return a damaged copy of Vagabond volume 3.",
    "Can I exchange the box set for the single volumes instead?",
    "Your order shipped on Monday and should arrive within three business days.",
    "Refunds go back to the original payment method within five to seven days.",
    "Please escalate this: the tracking number has not updated for ten days.",
    "Do you have the first printing of Dragon Ball volume 1?",
    "Which edition of Monster is the best value for a new reader?",
    "I prefer seinen manga with slow pacing and detailed artwork.",
    "I do not like romance; please skip romantic comedies in recommendations.",
    "The anime adaptation covers the manga up to chapter 137.",
    "Shonen Jump releases new chapters every Monday at midnight Japan time.",
    "Light novels are sold in a separate section from manga volumes.",
    "The Kindle edition includes the bonus chapter from the print release.",
    "Blue Lock volume 28 is on preorder with a limited acrylic stand.",
    "How many chapters of Kingdom have been translated so far?",
    "Is Oshi no Ko appropriate for a fifteen year old reader?",
    "Please recommend a sports manga similar to Haikyu!!",
    "Thanks, that helps a lot. Can you also check the price of volume 2?",
)

MANGA_CORPUS_JA: tuple[str, ...] = (
    "ワンピースの1巻は英語版がありますか？",
    "ナルトに似たマンガを教えてください。",
    "鬼滅の刃に似たマンガを5つ教えてください。",
    "進撃の巨人は全34巻で完結しています。",
    "呪術廻戦の最新刊はいつ発売されますか？",
    "葬送のフリーレンは旅の終わりから始まるファンタジーです。",
    "SPY×FAMILYはコメディとアクションが楽しめる作品です。",
    "チェンソーマン第二部は少年ジャンプ+で連載中です。",
    "僕のヒーローアカデミアは42巻で完結しました。",
    "注文した商品がまだ届いていません。配送状況を確認できますか？",
    "ベルセルクの完全版セットを返品したいです。",
    "表紙に傷があったので交換をお願いします。",
    "ご注文の商品は月曜日に発送され、三営業日以内に到着予定です。",
    "返金は元のお支払い方法に五から七営業日で戻ります。",
    "追跡番号が十日間更新されていないので、担当者につないでください。",
    "ドラゴンボールの初版第1巻は在庫がありますか？",
    "ゆっくりした展開で絵が細かい青年マンガが好きです。",
    "恋愛ものは苦手なので、ラブコメは除いてください。",
    "アニメは原作の137話までを描いています。",
    "少年ジャンプの新しい話は毎週月曜日の0時に公開されます。",
    "ブルーロックの28巻はアクリルスタンド付きの限定版を予約受付中です。",
    "キングダムは何巻まで翻訳されていますか？",
    "推しの子は中学生が読んでも大丈夫ですか？",
    "ハイキュー!!に似たスポーツマンガを教えてください。",
    "ありがとうございます。2巻の価格も確認できますか？",
    "電子書籍版には紙の本の特典ページも含まれています。",
    "モンスターは新しい読者にはどの版がおすすめですか？",
    "ダークファンタジーが好きな人におすすめのマンガはありますか？",
)

SYSTEM_PROMPT_EN = (
    "You are MangaAssist, the shopping assistant of a manga store. Answer briefly, name real "
    "titles only, and answer in the customer's language."
)
SYSTEM_PROMPT_JA = (
    "あなたはマンガ専門店のショッピングアシスタント、MangaAssistです。実在する作品名だけを挙げ、"
    "お客様の言語で簡潔に答えてください。"
)


def corpus_lines() -> list[str]:
    """Every corpus sentence plus a few mixed-language lines, as training text."""
    lines = [*MANGA_CORPUS_EN, *MANGA_CORPUS_JA, SYSTEM_PROMPT_EN, SYSTEM_PROMPT_JA]
    for english, japanese in zip(MANGA_CORPUS_EN, MANGA_CORPUS_JA, strict=False):
        lines.append(f"{english} {japanese}")
    return lines


def train_tokenizer(vocab_size: int = 2048) -> Tokenizer:
    """Train a byte-level BPE tokenizer (Llama-3 style special tokens) on the manga corpus."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines() * 4, trainer=trainer)
    return tokenizer


def write_model_dir(out_dir: Path, *, vocab_size: int = 2048) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (chat template) to ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(vocab_size)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "chat_template": LLAMA3_CHAT_TEMPLATE,
        "model_max_length": 8192,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8"
    )
    (out_dir / "README.txt").write_text(
        "Demo model directory for the MangaAssist gateway's simulated engine: a byte-level BPE\n"
        "tokenizer trained on a small manga corpus. No weights: only --engine sim can serve it.\n",
        encoding="utf-8",
    )
    return out_dir


def synthetic_conversation(
    tokenizer: Tokenizer,
    *,
    turns: int,
    tokens_per_turn: int = 100,
    seed: int = 0,
    japanese_share: float = 0.5,
) -> list[dict[str, str]]:
    """A ``turns``-message user/assistant history (oldest first), each message ≈ tokens_per_turn.

    Messages alternate user/assistant and end with a user message; a mix of Japanese and English
    sentences from the corpus, each message unique (numbered) so nothing is accidentally cached.
    """
    if turns < 1:
        raise ValueError(f"turns must be at least 1, got {turns}")
    rng = random.Random(seed)
    messages: list[dict[str, str]] = []
    for index in range(turns):
        role = "user" if (turns - 1 - index) % 2 == 0 else "assistant"
        parts = [f"({seed}-{index})"]
        count = len(tokenizer.encode(parts[0], add_special_tokens=False).ids)
        while count < tokens_per_turn:
            pool = MANGA_CORPUS_JA if rng.random() < japanese_share else MANGA_CORPUS_EN
            sentence = rng.choice(pool)
            parts.append(sentence)
            count += len(tokenizer.encode(" " + sentence, add_special_tokens=False).ids)
        messages.append({"role": role, "content": " ".join(parts)})
    return messages


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: build the demo model directory (skipped when it already exists unless --force)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory to write")
    parser.add_argument("--force", action="store_true", help="rebuild even if it exists")
    args = parser.parse_args(argv)
    if (args.out / "tokenizer.json").is_file() and not args.force:
        print(f"demo model already at {args.out} (use --force to rebuild)")
        return 0
    print(f"training a byte-level BPE tokenizer on the manga corpus -> {args.out}")
    write_model_dir(args.out)
    print(f"wrote {args.out / 'tokenizer.json'} and {args.out / 'tokenizer_config.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
