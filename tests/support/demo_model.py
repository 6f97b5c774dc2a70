"""A small, self-made model directory for tests, benchmarks and ``make local`` (test support:
it never ships in the image).

The gateway counts tokens with the served model's own tokenizer, read from the model directory
(``tokenizer.json`` plus the chat template in ``tokenizer_config.json``). Nothing here may download
at run time, so this module *trains* a byte-level BPE tokenizer on a small manga-shop corpus with
Japanese and English text (about a second) and writes it with a Llama-3-style chat template. The
simulated engine never reads weights, so a tokenizer directory is a complete "model" for it.

Run ``python -m tests.support.demo_model --out .cache/llm-demo-model`` to build one.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from prompts import (
    LLAMA3_BOS,
    LLAMA3_EOT,
    LLAMA3_INSTRUCT_CHAT_TEMPLATE,
    MANGA_CORPUS_EN,
    MANGA_CORPUS_JA,
    SYSTEM_PROMPT_EN,
    SYSTEM_PROMPT_JA,
)
from tests.support.tiny_llama import train_byte_level_bpe


def corpus_lines() -> list[str]:
    """Every corpus sentence plus a few mixed-language lines, as training text."""
    lines = [*MANGA_CORPUS_EN, *MANGA_CORPUS_JA, SYSTEM_PROMPT_EN, SYSTEM_PROMPT_JA]
    for english, japanese in zip(MANGA_CORPUS_EN, MANGA_CORPUS_JA, strict=False):
        lines.append(f"{english} {japanese}")
    return lines


def train_tokenizer(vocab_size: int = 2048) -> Tokenizer:
    """A byte-level BPE tokenizer (Llama-3 style special tokens) trained on the manga corpus
    (:func:`tests.support.tiny_llama.train_byte_level_bpe`, the one trainer)."""
    return train_byte_level_bpe(corpus_lines() * 4, vocab_size=vocab_size)


def write_model_dir(out_dir: Path, *, vocab_size: int = 2048) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (chat template) to ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(vocab_size)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {
        "bos_token": LLAMA3_BOS,
        "eos_token": LLAMA3_EOT,
        "chat_template": LLAMA3_INSTRUCT_CHAT_TEMPLATE,
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
