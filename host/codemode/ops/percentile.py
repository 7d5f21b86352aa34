"""The one percentile of the operator tools and the benchmarks: nearest rank, so every number printed
is a latency that was measured."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["percentile"]


def percentile(samples: Sequence[float], p: float) -> float:
    """The sample at rank ``p`` percent (nearest rank over ``len - 1`` steps: 0 is the least, 100
    the greatest, 50 the median's nearest sample).

    Args:
        samples: the samples (non-empty, in any order).
        p: the percentile, 0 to 100.

    Returns:
        The sample at that rank.

    Raises:
        ValueError: no samples, or ``p`` outside 0 to 100.
    """
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is outside 0 to 100")
    ordered = sorted(samples)
    return ordered[round(p / 100 * (len(ordered) - 1))]
