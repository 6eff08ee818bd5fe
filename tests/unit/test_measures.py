"""devkit.measures: what the figures of tests, benchmarks and the demo are made of."""

from __future__ import annotations

import math

import pytest

from devkit.measures import kendall_tau, peak_of_records, peak_overlap, percentile, steps


def test_kendall_tau() -> None:
    assert kendall_tau(list(range(50))) == 1.0
    assert kendall_tau(list(range(50))[::-1]) == -1.0
    assert kendall_tau([0, 2, 1, 3]) == pytest.approx(4 / 6)  # 5 concordant, 1 discordant
    assert kendall_tau([1, 1, 2]) == pytest.approx(2 / 3)  # a tie counts as neither
    assert kendall_tau([]) == kendall_tau([7]) == 1.0


def test_kendall_tau_matches_the_pairwise_definition_on_a_long_order() -> None:
    order = [(i * 7919) % 1000 for i in range(1000)]
    pairs = [(a, b) for i, a in enumerate(order) for b in order[i + 1 :]]
    expected = (sum(a < b for a, b in pairs) - sum(a > b for a, b in pairs)) / len(pairs)
    assert kendall_tau(order) == pytest.approx(expected)


def test_percentile() -> None:
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile([5.0], 90) == 5.0
    assert math.isnan(percentile([], 50))


def test_peak_overlap_and_steps() -> None:
    intervals = [(0.0, 2.0), (1.0, 3.0), (2.0, 4.0), (5.0, 6.0)]
    assert peak_overlap(intervals) == 2  # an end at the instant of a start closes first
    assert steps([(0.0, 1.0), (0.5, 2.0)]) == [(0.0, 1), (0.5, 2), (1.0, 1), (2.0, 0)]
    assert peak_overlap([]) == 0


def test_peak_of_records() -> None:
    records = [
        {"at": 0.0, "event": "start"},
        {"at": 0.1, "event": "start"},
        {"at": 0.2, "event": "end"},
        {"at": 0.3, "event": "other"},
        {"at": 0.4, "event": "end"},
    ]
    assert peak_of_records(records) == 2
