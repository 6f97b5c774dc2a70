"""Sample manga-shop queries: parity and latency inputs for the compiler, warmup for the server.

They cover every intent in English and Japanese, short inputs (mostly padding, so the attention
mask matters) and one input far over 128 tokens (truncated, no padding at all). A compiled model
whose graph had baked in "no padding" or "all padding" would fail parity on one of the two.

Pure data, Python 3.10-compatible.
"""

from __future__ import annotations

SAMPLE_QUERIES: tuple[tuple[str, str], ...] = (
    ("Is One Piece volume 105 in stock in English?", "product_question"),
    ("ワンピースの105巻は英語版の在庫がありますか?", "product_question"),
    ("Does the Chainsaw Man box set include the poster?", "product_question"),
    ("What manga is similar to Attack on Titan?", "recommendation"),
    ("鬼滅の刃に似たマンガを5つ教えてください", "recommendation"),
    ("Recommend a cozy slice-of-life manga for a beginner", "recommendation"),
    ("Show me new isekai series released this month", "discovery"),
    ("今月発売の新しいスポーツ漫画を見せて", "discovery"),
    ("Where is my order of Jujutsu Kaisen volume 20?", "order_tracking"),
    ("注文した呪術廻戦の20巻はいつ届きますか", "order_tracking"),
    ("I want to return a damaged copy of Spy x Family", "return_request"),
    ("届いた本が破れていたので返品したいです", "return_request"),
    ("This is the third time my order is wrong, let me talk to a person", "escalation"),
    ("担当者と話させてください、何度も間違っています", "escalation"),
    ("Hi! How are you today?", "chitchat"),
    ("こんにちは、元気?", "chitchat"),
    ("What is your shipping policy for Japan?", "faq"),
    ("送料はいくらですか?", "faq"),
)
"""(text, intent it should mean) pairs. The intent is documentation for humans: the compiler
compares compiled with eager logits and does not need ground truth."""

LONG_QUERY: str = (
    "I have been reading manga for years and I loved Naruto, Bleach, One Piece, Hunter x Hunter, "
    "Fullmetal Alchemist, Death Note, Vinland Saga, Berserk, Monster, Pluto, 20th Century Boys, "
    "Vagabond, Slam Dunk, Haikyu, Blue Lock, Mob Psycho 100, One Punch Man, Dorohedoro, "
    "Chainsaw Man, Jujutsu Kaisen, Demon Slayer, My Hero Academia, Spy x Family, Frieren, "
    "Dungeon Meshi, Oshi no Ko, Kaguya-sama, Horimiya, Yotsuba, March Comes in Like a Lion "
    "and many more, so please recommend something new for me that has a long story arc, "
    "beautiful art, strong characters, a bit of comedy and a satisfying ending, ideally "
    "complete in under thirty volumes and available in English paperback editions. "
    "ナルト、ワンピース、鬼滅の刃、呪術廻戦、進撃の巨人、葬送のフリーレンが好きです。"
)
"""One query far longer than 128 tokens for any WordPiece vocabulary."""


def parity_texts() -> list[str]:
    """Every sample text plus the long one, in a fixed order."""
    return [text for text, _ in SAMPLE_QUERIES] + [LONG_QUERY]


def texts_for_batch(batch_size: int, offset: int = 0) -> list[str]:
    """``batch_size`` sample texts starting at ``offset``, cycling through :func:`parity_texts`."""
    if batch_size < 1:
        raise ValueError(f"batch_size: {batch_size!r} must be at least 1")
    texts = parity_texts()
    return [texts[(offset + i) % len(texts)] for i in range(batch_size)]
