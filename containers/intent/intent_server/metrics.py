"""CloudWatch EMF lines for the classifier, built only from the metrics contract.

Per /invocations: one document with IntentLatency (ms, tokenize + model) and IntentTruncations,
and one IntentPredictions document per predicted intent (the contract gives that metric the extra
dimension "Intent"). SageMaker ships the container's stdout to CloudWatch Logs, which turns these
JSON lines into metrics under EndpointName / VariantName (INTENT_METRICS_ENDPOINT_NAME /
INTENT_METRICS_VARIANT_NAME, set by the stack).

Pure document building plus a small line writer, Python 3.10-compatible.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any, TextIO

from metrics_contract import (
    INTENT_LATENCY,
    INTENT_PREDICTIONS,
    INTENT_TRUNCATIONS,
    emf_document,
)


def invocation_documents(*, endpoint_name: str, variant_name: str, latency_ms: float,
                         intents: Sequence[str], truncations: int, timestamp_ms: int,
                         target: str) -> list[dict[str, Any]]:
    """The EMF documents for one answered /invocations request."""
    dimensions = {"EndpointName": endpoint_name, "VariantName": variant_name}
    properties = {"Target": target, "Texts": len(intents)}
    documents = [emf_document({INTENT_LATENCY: latency_ms, INTENT_TRUNCATIONS: truncations},
                              dimensions, timestamp_ms=timestamp_ms, properties=properties)]
    for intent, count in sorted(Counter(intents).items()):
        documents.append(emf_document({INTENT_PREDICTIONS: count},
                                      {**dimensions, "Intent": intent},
                                      timestamp_ms=timestamp_ms))
    return documents


class EmfWriter:
    """Writes EMF documents as single JSON lines; one lock so lines never interleave."""

    def __init__(self, stream: TextIO, *, enabled: bool = True) -> None:
        self._stream = stream
        self._enabled = enabled
        self._lock = threading.Lock()

    def write(self, documents: Sequence[dict[str, Any]]) -> None:
        """Emit the documents (no-op when metrics are disabled)."""
        if not self._enabled or not documents:
            return
        text = "".join(json.dumps(d, separators=(",", ":"), ensure_ascii=False) + "\n"
                       for d in documents)
        with self._lock:
            self._stream.write(text)
            self._stream.flush()
