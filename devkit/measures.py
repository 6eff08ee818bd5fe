"""Measures the tests, the benchmarks and the demo compute from what tasks recorded."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any


def kendall_tau(order: Sequence[Any]) -> float:
    """Kendall's tau between the positions of ``order`` and its values: 1.0 when it is
    sorted, -1.0 when reversed (ties count as neither). Inversions are counted by merge
    sort, so long orders (thousands of tasks) are cheap."""
    n = len(order)
    if n < 2:
        return 1.0
    ties = sum(count * (count - 1) // 2 for count in _counts(order))

    def sort_count(items: list[Any]) -> tuple[list[Any], int]:
        if len(items) <= 1:
            return items, 0
        mid = len(items) // 2
        left, a = sort_count(items[:mid])
        right, b = sort_count(items[mid:])
        merged: list[Any] = []
        inversions = a + b
        i = j = 0
        while i < len(left) and j < len(right):
            if left[i] <= right[j]:
                merged.append(left[i])
                i += 1
            else:
                merged.append(right[j])
                inversions += len(left) - i
                j += 1
        merged += left[i:] + right[j:]
        return merged, inversions

    _, inversions = sort_count(list(order))
    pairs = n * (n - 1) // 2
    concordant = pairs - ties - inversions
    return (concordant - inversions) / pairs


def _counts(values: Sequence[Any]) -> list[int]:
    counts: dict[Any, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return list(counts.values())


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), interpolating linearly between closest ranks;
    NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def levels(changes: Iterable[tuple[float, int]]) -> list[tuple[float, int]]:
    """(time, how many run) after each change, from (time, +1 or -1) changes; an end at
    the same instant as a start counts first."""
    running, out = 0, []
    for at, delta in sorted(changes):
        running += delta
        out.append((at, running))
    return out


def steps(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, int]]:
    """(time, how many are open) after each start or end of the (start, end) intervals."""
    return levels([change for s, e in intervals for change in ((s, 1), (e, -1))])


def peak_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """Most (start, end) intervals open at once."""
    return max((n for _, n in steps(intervals)), default=0)


def peak_of_records(records: Iterable[dict[str, Any]]) -> int:
    """Most task bodies running at once, from ``{"at", "event": "start" | "end"}`` records."""
    changes = [
        (r["at"], 1 if r["event"] == "start" else -1)
        for r in records
        if r["event"] in ("start", "end")
    ]
    return max((n for _, n in levels(changes)), default=0)
