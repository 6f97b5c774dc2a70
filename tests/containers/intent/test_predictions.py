"""intent_server.predictions: a stable softmax and the answer's top label."""

from __future__ import annotations

import math

import pytest

from intent_server.predictions import predict, softmax
from intents import INTENT_LABELS


def test_softmax_is_stable_and_predict_picks_the_top_label() -> None:
    probabilities = softmax([1000.0, 1000.0, -1000.0])
    assert probabilities[:2] == [0.5, 0.5]
    assert probabilities[2] == 0.0
    logits = [0.0] * 8
    logits[3] = 2.0
    prediction = predict(logits, INTENT_LABELS, truncated=True, tokens=128)
    assert prediction.intent == "order_tracking"
    assert math.isclose(sum(prediction.scores.values()), 1.0)
    body = prediction.to_json(max_seq_length=128)
    assert body["truncated"] is True
    assert "first 128" in body["note"]
    with pytest.raises(ValueError, match="1 logits for 8 labels"):
        predict([1.0], INTENT_LABELS, truncated=False, tokens=3)
    with pytest.raises(ValueError, match="non-finite"):
        softmax([math.nan])
