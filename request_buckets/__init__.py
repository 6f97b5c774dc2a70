"""Request sizes: the S/M/L/XL length buckets, defined once for the whole platform.

A request's *size* is what its KV cache must hold at the end: prompt tokens plus the tokens it
may generate (the gateway reserves exactly that). Seed 002 says to bucket requests by token
range (S, M, L, XL) to see whether long-context traffic has surged, and to size concurrency per
bucket. Four places need the same buckets, so they all read this module and none defines its
own: the gateway's admission (which bucket a request is, each bucket's concurrency cap, XL
refused while the circuit breaker is open), the GPU budget (how many requests of each bucket
the KV pool holds), the metrics contract (the ``Bucket`` dimension of ``AdmissionRejections``)
and the dashboard (one line per bucket, labelled with its range).

Why these bounds. They are fractions of the engine's context window, ``max_model_len``, because
a request can never be larger than the window and "long" only means something relative to it.
Seed 001 splits the 4,096-token window into 512 system prompt + 1,024 RAG context + 2,048
history + 512 output; the bucket bounds are the sizes of the requests that split produces:

* **S ≤ 1/8 of the window** (512 at 4,096): fits the output share alone — a one-line question
  with a short answer (FAQ, chitchat, an intent-routed lookup with a small ``max_tokens``);
* **M ≤ 1/4** (1,024): system prompt + question + a full answer — a first turn without
  retrieved context;
* **L ≤ 1/2** (2,048): system + RAG context + answer — a first turn with retrieval, or a short
  conversation;
* **XL > 1/2**, up to the window: the request also carries a long history. This is the
  long-context traffic to watch (docs/design-decisions.md#request-buckets), the bucket the circuit
  breaker refuses while open ("start a fresh context"), and the one that fills the KV pool
  fastest (a burst of long requests crashes the service even when the average is fine,
  docs/design-decisions.md#kv-grows-with-concurrency).

Scaling by the window keeps every bucket reachable and XL meaning "more than half the window"
whatever ``max_model_len`` an environment runs: fixed bounds of 512/2,048/8,192 at a 4,096
window leave XL empty and the breaker's XL refusal dead.

Pure module, no imports beyond the standard library, importable on Python 3.10 (the Inf1
serving image copies ``metrics_contract``, which reads :data:`BUCKET_NAMES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from fractions import Fraction
from typing import Literal


# (str, Enum) rather than StrEnum: Python 3.10 (the Inf1 image) has no StrEnum.
class RequestBucket(str, Enum):  # noqa: UP042
    """A request-size bucket; its value is the name metrics and responses carry."""

    S = "S"
    M = "M"
    L = "L"
    XL = "XL"

    def __str__(self) -> str:
        return str(self.value)


BUCKET_NAMES: tuple[str, ...] = tuple(bucket.value for bucket in RequestBucket)
"""The bucket names, smallest first: the values of the ``Bucket`` metric dimension."""

UNSIZED = "Unsized"
"""The ``Bucket`` of a request refused before it was parsed and sized: the gateway's prefill valve
refuses on arrival, without parsing, when not even the smallest prompt would start within the
SLO (docs/design-decisions.md#surge-admission)."""
REJECTION_BUCKETS: tuple[str, ...] = (*BUCKET_NAMES, UNSIZED)
"""The values of ``AdmissionRejections``' ``Bucket`` dimension: every bucket, and
:data:`UNSIZED`."""

BucketName = Literal["S", "M", "L", "XL"]
"""A bucket's name as a type (pydantic models and request schemas); the same names as
:data:`BUCKET_NAMES` (tests/test_environment_contract.py holds them equal)."""
UPPER_BOUND_SHARES: dict[RequestBucket, Fraction] = {
    RequestBucket.S: Fraction(1, 8),
    RequestBucket.M: Fraction(1, 4),
    RequestBucket.L: Fraction(1, 2),
}
"""Each bounded bucket's upper bound as a share of ``max_model_len`` (XL: up to the window)."""

MIN_MAX_MODEL_LEN = 8
"""The smallest window with a bound of at least one token for every bucket."""


@dataclass(frozen=True)
class BucketBounds:
    """The buckets for one context window: S ≤ ``s_max``, M ≤ ``m_max``, L ≤ ``l_max``, XL above.

    Build it with :func:`bucket_bounds`; bounds are inclusive token counts (prompt + output).
    """

    max_model_len: int
    s_max: int
    m_max: int
    l_max: int

    def __post_init__(self) -> None:
        if not 1 <= self.s_max < self.m_max < self.l_max < self.max_model_len:
            raise ValueError(
                f"bucket bounds S {self.s_max}, M {self.m_max}, L {self.l_max} at max_model_len "
                f"{self.max_model_len} are not accepted; accepted: 1 <= S < M < L < max_model_len")

    def upper(self, bucket: RequestBucket | str) -> int:
        """The largest request size in ``bucket`` (XL: the whole window)."""
        key = RequestBucket(bucket)
        return {RequestBucket.S: self.s_max, RequestBucket.M: self.m_max,
                RequestBucket.L: self.l_max, RequestBucket.XL: self.max_model_len}[key]

    def lower_exclusive(self, bucket: RequestBucket | str) -> int:
        """The previous bucket's upper bound (0 for S): sizes in ``bucket`` are above it."""
        index = list(RequestBucket).index(RequestBucket(bucket))
        return 0 if index == 0 else self.upper(list(RequestBucket)[index - 1])

    def classify(self, tokens: int) -> RequestBucket:
        """The bucket of a request that reserves ``tokens`` (sizes above the window are XL)."""
        for bucket in (RequestBucket.S, RequestBucket.M, RequestBucket.L):
            if tokens <= self.upper(bucket):
                return bucket
        return RequestBucket.XL

    def label(self, bucket: RequestBucket | str) -> str:
        """Human-readable range, e.g. ``S ≤ 512`` or ``XL 2,049–4,096`` (tokens);
        :data:`UNSIZED` is ``unsized (refused unparsed)``."""
        if bucket == UNSIZED:
            return "unsized (refused unparsed)"
        key = RequestBucket(bucket)
        if key is RequestBucket.S:
            return f"S ≤ {self.s_max:,}"
        return f"{key.value} {self.lower_exclusive(key) + 1:,}–{self.upper(key):,}"


def bucket_bounds(max_model_len: int) -> BucketBounds:
    """The buckets for a context window of ``max_model_len`` tokens (see the module docstring).

    ValueError names the value and what is accepted (a bool or a window under
    :data:`MIN_MAX_MODEL_LEN` tokens).
    """
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) \
            or max_model_len < MIN_MAX_MODEL_LEN:
        raise ValueError(f"max_model_len {max_model_len!r} is not accepted; accepted: an integer "
                         f">= {MIN_MAX_MODEL_LEN} (tokens)")
    s_max, m_max, l_max = (int(share * max_model_len)
                           for share in UPPER_BOUND_SHARES.values())
    return BucketBounds(max_model_len=max_model_len, s_max=s_max, m_max=m_max, l_max=l_max)
