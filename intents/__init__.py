"""The intents the MangaAssist router knows, in one place.

The DistilBERT classifier is trained and compiled with exactly these labels (in this order: the
order is the classifier head's output order), its server answers with them, and the LLM gateway's
adapter-routing table may only name them.
"""

from __future__ import annotations

INTENT_LABELS: tuple[str, ...] = (
    "product_question",
    "recommendation",
    "discovery",
    "order_tracking",
    "return_request",
    "escalation",
    "chitchat",
    "faq",
)
"""Classifier output order. Appending is safe; reordering invalidates every compiled model."""


def require_intent(value: str, *, field: str = "intent") -> str:
    """Return ``value`` if it is a known intent, else raise ValueError naming the field."""
    if value not in INTENT_LABELS:
        raise ValueError(
            f"{field}: unknown intent {value!r}; accepted: {', '.join(INTENT_LABELS)}"
        )
    return value
