"""How long answers are, as the streams show them: what one request is expected to hold at its
end, so that a request whose prompt and expected answer take more than the watermark's share of
the pool is refused as never fitting (:class:`gateway.admission.ledger.AdmissionLedger`).

Pure module: standard library only.
"""

from __future__ import annotations

from collections import deque


class OutputLengths:
    """How long answers are: the 90th percentile of the last ``window`` answers.

    An answer cut at its ``max_tokens`` says only that it would have been at least that long, so
    the quantile is trusted only while fewer than ``1 − quantile`` of the recent answers were cut
    (then the 90th percentile is a natural length); otherwise, and before ``min_answers`` answers,
    a request is expected to use its whole ``max_tokens``.
    """

    def __init__(self, *, window: int = 256, quantile: float = 0.9,
                 min_answers: int = 20) -> None:
        self._recent: deque[tuple[int, bool]] = deque(maxlen=window)
        self._quantile = quantile
        self._min_answers = min_answers
        self._cached: int | None = None
        self._stale = True

    def observe(self, completion_tokens: int, *, capped: bool) -> None:
        """A finished answer's length, and whether ``max_tokens`` cut it."""
        self._recent.append((max(1, completion_tokens), capped))
        self._stale = True

    def typical(self) -> int | None:
        """The quantile of natural lengths, or None when it cannot be trusted (see above)."""
        if self._stale:
            self._stale = False
            self._cached = None
            capped = sum(1 for _, cut in self._recent if cut)
            if (len(self._recent) >= self._min_answers
                    and capped < (1 - self._quantile) * len(self._recent)):
                ordered = sorted(tokens for tokens, _ in self._recent)
                self._cached = ordered[min(len(ordered) - 1,
                                           int(self._quantile * len(ordered)))]
        return self._cached

    def expected(self, max_tokens: int) -> int:
        """Tokens a request with this ``max_tokens`` is expected to generate."""
        typical = self.typical()
        return max_tokens if typical is None else max(1, min(max_tokens, typical))
