"""Fair share between accounts and the message's priority, in real ``celery worker``
processes (celery_apps/limited_app.py), on a Redis broker (lower priority numbers go
first there, 0 the default and the most urgent).

What an observer sees from the task bodies' own records: a late account's tasks start
between the busy account's instead of after all of them, each account in its own
order, in both wait modes; a weighted account gets its share under a rate; a more
urgent task goes ahead of a line published before it. Tolerant bounds; the figures
are benchmarks/bench_fair.py's (real workers) and bench_fair_core.py's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery_harness import max_overlap
from cluster_tools import Clusters
from test_handover import PARKING

from devkit.measures import kendall_tau

pytestmark = pytest.mark.slow


@pytest.fixture
def clusters(celery_cluster: Any) -> Iterator[Clusters]:
    with Clusters(celery_cluster) as made:
        yield made


def starts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((e for e in events if e["event"] == "start"), key=lambda e: e["at"])


@pytest.mark.parametrize("task", ["fair_call", "fair_call_countdown", "fair_joint"])
def test_a_late_account_is_served_in_turns_not_behind_the_busy_one(
    clusters: Clusters, task: str
) -> None:
    cluster = clusters(extra_conf=PARKING)
    for name in ("w1", "w2"):
        cluster.worker(name, concurrency=2)
    call = getattr(cluster.app_module, task)
    busy = [call.delay("A", 0.1, f"a{i:02}") for i in range(30)]
    time.sleep(0.5)
    late_at = time.time()
    late = [call.delay("B", 0.1, f"b{i:02}") for i in range(8)]
    for result in busy + late:
        result.get(timeout=90)
    events = cluster.events()
    assert max_overlap(events) <= 2, "the cap of 2 holds"
    logs = "".join(worker.text() for worker in cluster.workers)
    assert "one after the other" not in logs, "a fair limit and another: one step"
    begun = starts(events)
    a_tags = [e["tag"] for e in begun if e["tag"].startswith("a")]
    b_tags = [e["tag"] for e in begun if e["tag"].startswith("b")]
    assert kendall_tau(a_tags) >= 0.9 and kendall_tau(b_tags) >= 0.9, "each account in order"
    last_b = max(e["at"] for e in begun if e["tag"].startswith("b"))
    a_between = [e for e in begun if e["tag"].startswith("a") and late_at < e["at"] < last_b]
    a_after = [e for e in begun if e["tag"].startswith("a") and e["at"] > last_b]
    # In turns: about one A for each B (8), plus those already handed over or in
    # flight when B came; first come, first served would start every A left first.
    assert len(a_between) <= 14, f"{len(a_between)} of A's tasks started before B's last"
    assert len(a_after) >= 5, "A's backlog outlasts B's tasks"


def test_a_weighted_account_gets_its_share_under_a_rate(clusters: Clusters) -> None:
    cluster = clusters(extra_conf=PARKING)
    for name in ("w1", "w2"):
        cluster.worker(name, concurrency=2)
    paced = cluster.app_module.fair_paced
    silver = [paced.delay("silver", 0.01, f"s{i:02}") for i in range(24)]
    gold = [paced.delay("gold", 0.01, f"g{i:02}") for i in range(24)]
    for result in silver + gold:
        result.get(timeout=90)
    begun = starts(cluster.events())
    first_gold = next(i for i, e in enumerate(begun) if e["tag"].startswith("g"))
    # While both wait (from gold's first start until gold's 15th): 3 gold to 1 silver.
    # Exact in the line (tests/conformance: 3 of every 4 turns); here the bound says
    # that the workers pass each task's account and weight to it, whatever their timing.
    window = begun[first_gold : first_gold + 16]
    gold_share = sum(e["tag"].startswith("g") for e in window) / len(window)
    assert 0.6 <= gold_share <= 0.9, f"gold took {gold_share:.2f} of 16 starts (3:1 is 0.75)"
    times = [e["at"] for e in begun]
    assert (len(times) - 1) / (times[-1] - times[0]) <= 21, "the rate of 20/s holds"


@pytest.mark.parametrize("task", ["prioritized", "prioritized_countdown"])
def test_a_more_urgent_task_goes_ahead_of_the_line(clusters: Clusters, task: str) -> None:
    cluster = clusters(extra_conf=PARKING)
    for name in ("w1", "w2"):
        cluster.worker(name, concurrency=2)
    call = getattr(cluster.app_module, task)
    line = [call.apply_async((0.15, f"n{i:02}"), priority=5) for i in range(12)]
    time.sleep(0.3)
    urgent = call.apply_async((0.15, "urgent"), priority=0)  # Redis: 0 goes first
    for result in [*line, urgent]:
        result.get(timeout=90)
    begun = starts(cluster.events())
    tags = [e["tag"] for e in begun]
    position = tags.index("urgent")
    assert position <= 5, f"the urgent task started {position + 1}th of 13: {tags}"
    assert [t for t in tags if t != "urgent"] == sorted(t for t in tags if t != "urgent")


def test_a_fair_by_function_that_fails_fails_its_task_with_a_clear_message(
    clusters: Clusters,
) -> None:
    cluster = clusters()
    cluster.worker("w1", concurrency=2)
    result = cluster.app_module.fair_broken.delay("nobody")
    with pytest.raises(Exception, match=r"fair_by function .* failed on this task's arguments"):
        result.get(timeout=30)
    assert cluster.app_module.fair_call.delay("A", 0.0, "after").get(timeout=30) == "after"


def test_max_per_key_caps_an_account_and_keeps_the_other_going(clusters: Clusters) -> None:
    """``max_per_key=1`` on a fair limit of 2: account A never runs two at once, and its
    backlog does not stop B from using the second permit."""
    cluster = clusters(extra_conf=PARKING)
    for name in ("w1", "w2"):
        cluster.worker(name, concurrency=2)
    call = cluster.app_module.fair_capped
    busy = [call.delay("A", 0.2, f"a{i:02}") for i in range(8)]
    time.sleep(0.3)
    late = [call.delay("B", 0.2, f"b{i:02}") for i in range(4)]
    for result in busy + late:
        result.get(timeout=90)
    events = cluster.events()
    assert max_overlap([e for e in events if e["tag"].startswith("a")]) <= 1, "A: 1 at once"
    assert max_overlap([e for e in events if e["tag"].startswith("b")]) <= 1, "B: 1 at once"
    assert max_overlap(events) <= 2, "the shared cap of 2 holds"
    begun = starts(events)
    last_b = max(e["at"] for e in begun if e["tag"].startswith("b"))
    a_after = [e for e in begun if e["tag"].startswith("a") and e["at"] > last_b]
    assert a_after, "B's tasks ran beside A's backlog, not after it"
