"""Request lengths: blocks per request and an observed length distribution.

A request's *length* here is what its KV cache must hold at the end: prompt tokens plus the
tokens it generates. The S/M/L/XL buckets it falls in are not defined here: they belong to
:mod:`request_buckets` (fractions of ``max_model_len``, explained there), which the gateway's
admission, the metrics contract and the dashboard read as well, so the budget's per-bucket
concurrency means exactly what the gateway's per-bucket caps and rejection metrics mean.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from request_buckets import BUCKET_NAMES, BucketBounds


def blocks_for_tokens(tokens: int, block_size: int) -> int:
    """KV blocks a sequence of ``tokens`` occupies: paged allocation rounds up to whole blocks
    (0 tokens: 0 blocks). The one rule, for the budget and the gateway's admission alike;
    ValueError for negative tokens or a block size below 1."""
    if tokens < 0 or block_size < 1:
        raise ValueError(f"tokens must be >= 0 and block_size >= 1, got {tokens}, {block_size}")
    return -(-tokens // block_size)


@dataclass(frozen=True)
class RequestLengthDistribution:
    """Observed request lengths (prompt + generated tokens), e.g. from gateway logs.

    Build it from samples (:meth:`from_samples`); summary statistics and per-bucket shares are
    computed from the samples, nothing is assumed about their shape.
    """

    samples: tuple[int, ...]

    @classmethod
    def from_samples(cls, samples: Iterable[int]) -> RequestLengthDistribution:
        """Validate and keep ``samples`` (positive integers, at least one)."""
        values: list[int] = []
        for index, value in enumerate(samples):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"request length #{index + 1} must be a positive integer token count, "
                    f"got {value!r}"
                )
            values.append(value)
        if not values:
            raise ValueError("request_lengths must hold at least one request length")
        return cls(tuple(values))

    @property
    def count(self) -> int:
        """Number of samples."""
        return len(self.samples)

    @property
    def mean_tokens(self) -> float:
        """Mean request length in tokens."""
        return sum(self.samples) / len(self.samples)

    def percentile_tokens(self, fraction: float) -> int:
        """Nearest-rank percentile (``fraction`` in (0, 1]), e.g. 0.95 for p95."""
        ordered = sorted(self.samples)
        rank = max(1, math.ceil(fraction * len(ordered)))
        return ordered[rank - 1]

    def mean_blocks(self, block_size: int) -> float:
        """Mean KV blocks per request under paged allocation."""
        return sum(blocks_for_tokens(n, block_size) for n in self.samples) / len(self.samples)

    def bucket_shares(self, bounds: BucketBounds) -> dict[str, float]:
        """Fraction of requests in each bucket of ``bounds`` (all four keys present)."""
        counts = dict.fromkeys(BUCKET_NAMES, 0)
        for value in self.samples:
            counts[bounds.classify(value).value] += 1
        return {name: count / len(self.samples) for name, count in counts.items()}

    def count_longer_than(self, tokens: int) -> int:
        """How many samples exceed ``tokens`` (would be rejected at that max_model_len)."""
        return sum(1 for value in self.samples if value > tokens)


def as_distribution(
    request_lengths: RequestLengthDistribution | Sequence[int] | None,
) -> RequestLengthDistribution | None:
    """Accept a distribution, a plain sequence of token counts, or None."""
    if request_lengths is None or isinstance(request_lengths, RequestLengthDistribution):
        return request_lengths
    return RequestLengthDistribution.from_samples(request_lengths)


SEED_EXAMPLE_REQUEST_TOKENS: tuple[int, ...] = (95, 180, 220, 350, 480, 610, 750, 900, 1045, 1100)
"""An illustrative ten-request sample for the static-vs-paged comparison.

It contains the three requests the requirements quote (95, 180 and 220 tokens,
docs/design-decisions.md#static-kv-waste) and has a mean of 573 tokens, which reproduces their
profiled 28 % use of a 2,048-token static KV slot (0.28 × 2,048 ≈ 573).
It is an input assumption, not a measurement.
"""
