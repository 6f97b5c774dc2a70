"""KV-aware admission: serve what can be served within the TTFT SLO, refuse the rest at once.

The parts, each readable in one sitting (docs/design-decisions.md#surge-admission):

* :mod:`~gateway.admission.ledger` — the KV blocks the dispatched requests hold, per length
  bucket, against the engine's real pool (vLLM's dispatch rule);
* :mod:`~gateway.admission.valve` — the prefill valve that decides on arrival: the prompt tokens
  waiting for their first token against the target × the drain rate measured from first tokens;
* :mod:`~gateway.admission.turnover` — when a request waiting for KV room would have its first
  token (the running answers' ends, replayed): the step the valve's one rate cannot express;
* :mod:`~gateway.admission.lengths` — how long answers are (one request's expected end-state);
* :mod:`~gateway.admission.controller` — the queue and the clock that tie them together.
"""

from gateway.admission.controller import (
    AdmissionController,
    AdmissionRejected,
    AdmissionRequest,
    ArrivalCounts,
    ScreenPass,
    retry_after_header,
)
from gateway.admission.ledger import (
    AdmissionLedger,
    KvReservation,
    LengthBucket,
    RefusalReason,
    classify_bucket,
)
from gateway.admission.valve import PrefillValve

__all__ = ["AdmissionController", "AdmissionLedger", "AdmissionRejected", "AdmissionRequest",
           "ArrivalCounts", "KvReservation", "LengthBucket", "PrefillValve", "RefusalReason",
           "ScreenPass", "classify_bucket", "retry_after_header"]
