"""argparse types the capacity commands share (``python -m tools.capacity``,
``python -m tools.decode_bench``): light, so the GPU box's benchmark imports no settings."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """argparse type: a number of ``kind`` above 0."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
        return value
    return parse


def batch_sizes_argument(text: str) -> list[int]:
    """argparse type for a comma-separated list of batch sizes (sorted, unique, each >= 1)."""
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: accepted: integers like 1,8,32") from None
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: accepted: integers >= 1")
    return sizes
