"""The metrics' counters and histograms (lua/common_meta.lua's bump() and observe(): the
Redis store's ``meta`` fields ``m_*``; the PostgreSQL store's ``counters`` column):
each step of the model counts what it did where the scripts do, and the conformance
suite compares them (`celery_semaphore.metrics` reads them from any store).

A counter is a field name (``m_granted``, ``m_refused``...), a histogram observation
one bucket's field (`celery_semaphore.core.constants.histogram_fields`) and its sum.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter

from celery_semaphore.core.constants import HISTOGRAM_BOUNDS_MS, histogram_fields

#: The fair weight classes of ``m_fair_granted_c<class>``: weight 1, 2-3, 4-7, 8-15, 16+.
WEIGHT_CLASSES = 5


def weight_class(fair_weight: int) -> int:
    """The metrics' class of a fair weight (weight_class()): 0 for 1, 1 for 2-3, 2 for
    4-7, 3 for 8-15, 4 above."""
    return min(max(fair_weight, 1).bit_length() - 1, WEIGHT_CLASSES - 1)


class Counters(Counter[str]):
    """The counters of one semaphore, by field."""

    def bump(self, field: str, n: int = 1) -> None:
        if n > 0:
            self[field] += n

    def observe(self, kind: str, ms: int) -> None:
        """One observation of ``ms`` in histogram ``kind`` ("wait" or "hold"): the
        first bucket whose bound is at least ``ms`` (else the last), and its sum."""
        self[histogram_fields(kind)[bisect_left(HISTOGRAM_BOUNDS_MS, ms)]] += 1
        if ms >= 1:
            self[f"m_{kind}_sum"] += ms
