"""LimitedTask in real ``celery worker`` processes: the cap, FIFO order, waits as retries."""

from __future__ import annotations

import pytest
from celery_harness import max_overlap

pytestmark = pytest.mark.slow


def test_cap_holds_across_two_workers_and_start_order_is_fifo(celery_cluster):
    cluster = celery_cluster(limit=2)
    cluster.worker("w1", concurrency=3)
    cluster.worker("w2", concurrency=3)
    results = [cluster.app_module.hold.delay(0.3, i) for i in range(12)]
    assert [r.get(timeout=60) for r in results] == list(range(12))
    events = cluster.events()
    assert max_overlap(events) == 2
    starts = sorted((e["at"], e["tag"]) for e in events if e["event"] == "start")
    assert len(starts) == 12
    # Two permits free together (both holds are 0.3 s): the two tasks they go to start
    # within milliseconds, in either order. A task that starts later by more than a
    # tenth of the hold than one behind it in line is out of order.
    inversions = [
        (a, b)
        for i, (at_a, a) in enumerate(starts)
        for at_b, b in starts[i + 1 :]
        if a > b and at_b - at_a > 0.03
    ]
    assert len(inversions) <= 1, (inversions, starts)
    cluster.wait_for(lambda: cluster.holders() == 0, 1.0, "holders back to zero")
    assert cluster.waiters() == 0


def test_a_worker_warns_of_tasks_that_declare_one_semaphore_with_different_limits(
    celery_cluster,
):
    cluster = celery_cluster()
    log = cluster.worker("w1", concurrency=1, app="disagreeing_app").text()
    warnings = [line for line in log.splitlines() if "with different limits" in line]
    assert len(warnings) == 1, log
    assert (
        "tasks disagreeing_app.sync_invoices (limit 3) and disagreeing_app.sync_orders "
        "(limit 5) share the semaphore 'partner-api' with different limits" in warnings[0]
    )
    assert "only while fewer than its own limit hold it" in warnings[0]
    assert "set-limit partner-api N` applies to all of them" in warnings[0]
    assert "'reports'" not in log
