"""Fixed-shape tokenization shared by the compiler and the server.

Every compiled model takes ``input_ids`` and ``attention_mask`` of shape batch × max_length:
texts are truncated to max_length tokens (special tokens included) and padded with the pad id.
The server encodes with exactly this code from the artifact's tokenizer.json, and the compiler
checks that it produces the same ids as the model directory's own tokenizer before it measures
parity, so what was checked is what is served.

Needs only ``tokenizers`` (no torch), Python 3.10-compatible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class FixedShapeBatch:
    """Token ids and masks of a batch, each row exactly ``max_length`` long."""

    input_ids: list[list[int]]
    attention_mask: list[list[int]]
    truncated: list[bool]
    """Per text: True when it had more than max_length tokens and was cut."""
    token_counts: list[int]
    """Per text: tokens actually fed to the model (special tokens included, padding excluded)."""


def load_fixed_length_tokenizer(tokenizer_json: Path, *, max_length: int, pad_id: int) -> Any:
    """Load tokenizer.json and set truncation and padding to exactly ``max_length``."""
    from tokenizers import Tokenizer

    if max_length < 2:
        raise ValueError(f"max_length: {max_length!r} leaves no room for [CLS] and [SEP]")
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    pad_token = tokenizer.id_to_token(pad_id)
    if pad_token is None:
        raise ValueError(f"pad_token_id: {pad_id!r} is not in the vocabulary of {tokenizer_json}")
    tokenizer.enable_truncation(max_length=max_length)
    tokenizer.enable_padding(length=max_length, pad_id=pad_id, pad_token=pad_token)
    return tokenizer


def encode_fixed(tokenizer: Any, texts: Sequence[str]) -> FixedShapeBatch:
    """Encode ``texts`` with a tokenizer from :func:`load_fixed_length_tokenizer`."""
    encodings = tokenizer.encode_batch(list(texts))
    return FixedShapeBatch(
        input_ids=[list(e.ids) for e in encodings],
        attention_mask=[list(e.attention_mask) for e in encodings],
        # With truncation on, the cut-off remainder is returned as overflowing encodings.
        truncated=[len(e.overflowing) > 0 for e in encodings],
        token_counts=[sum(e.attention_mask) for e in encodings],
    )
