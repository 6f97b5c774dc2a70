"""Logits → the answer a caller reads: intent, confidence, every score, and truncation.

Pure module, Python 3.10-compatible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def softmax(logits: Sequence[float]) -> list[float]:
    """Numerically stable softmax; raises ValueError on an empty or non-finite row."""
    if not logits:
        raise ValueError("softmax: no logits")
    if not all(math.isfinite(x) for x in logits):
        raise ValueError(f"softmax: non-finite logit in {list(logits)!r}")
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = math.fsum(exps)
    return [e / total for e in exps]


@dataclass(frozen=True)
class Prediction:
    """The classifier's answer for one text."""

    intent: str
    confidence: float
    scores: dict[str, float]
    truncated: bool
    tokens: int

    def to_json(self, *, max_seq_length: int) -> dict[str, Any]:
        """The response object; a truncated text says so in words as well as in a flag."""
        body: dict[str, Any] = {
            "intent": self.intent,
            "confidence": round(self.confidence, 6),
            "scores": {label: round(p, 6) for label, p in self.scores.items()},
            "truncated": self.truncated,
        }
        if self.truncated:
            body["note"] = (f"input longer than {max_seq_length} tokens: classified on the first "
                            f"{max_seq_length}")
        return body


def predict(logits: Sequence[float], labels: Sequence[str], *, truncated: bool,
            tokens: int) -> Prediction:
    """The most probable label and the probability of every label."""
    if len(logits) != len(labels):
        raise ValueError(f"model returned {len(logits)} logits for {len(labels)} labels")
    probabilities = softmax(logits)
    best = max(range(len(labels)), key=lambda index: probabilities[index])
    return Prediction(intent=labels[best], confidence=probabilities[best],
                      scores=dict(zip(labels, probabilities, strict=True)),
                      truncated=truncated, tokens=tokens)
