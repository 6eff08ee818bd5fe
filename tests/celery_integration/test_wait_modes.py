"""A task's own ``semaphore_wait_mode`` is honoured everywhere, in real workers.

A task declared with ``semaphore_wait_mode="handover"`` in an app whose mode is
``"countdown"`` parks (at publish or at the worker), and the workers consume the
handover queues and look after parked tasks for it, though the app's mode says
countdown. Before the wait mode was resolved in one place, such tasks parked
onto a handover queue no worker consumed: 2 of 8 ran in 30 s. The reverse, a
countdown task in a handover app, never parks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery_harness import max_overlap
from cluster_tools import Clusters, eta_countdowns
from test_handover import PARKING, block, states

pytestmark = pytest.mark.slow


@pytest.fixture
def clusters(celery_cluster: Any) -> Iterator[Clusters]:
    with Clusters(celery_cluster) as made:
        yield made


def test_a_handover_task_in_a_countdown_app_parks_and_is_handed_over(clusters: Clusters) -> None:
    cluster = clusters(extra_conf={**PARKING, "semaphore_wait_mode": "countdown"})
    events = clusters.events(cluster)
    cluster.worker("w1", concurrency=3, extra=["-E"])
    sem = cluster.semaphore("own-mode", 1)
    blocker = block(cluster, "own-mode", limit=1)
    task = cluster.app_module.parks_in_any_app
    results = [task.delay(0.3, i) for i in range(8)]
    ids = [r.id for r in results]
    cluster.wait_for(lambda: states(sem) == dict.fromkeys(ids, "parked"), 20, "8 tasks parked")
    blocker.release()
    assert [r.get(timeout=30) for r in results] == list(range(8))
    assert max_overlap(cluster.events()) == 1
    for result in results:
        assert eta_countdowns(events, result.id) == [], "a countdown retry in handover mode"
    assert sem.status().parked_count == 0


def test_a_countdown_task_in_a_handover_app_never_parks(clusters: Clusters) -> None:
    cluster = clusters(extra_conf={**PARKING, "semaphore_backoff_max": 0.3})
    events = clusters.events(cluster)
    cluster.worker("w1", concurrency=3, extra=["-E"])
    sem = cluster.semaphore("own-mode", 1)
    blocker = block(cluster, "own-mode", limit=1)
    task = cluster.app_module.counts_down_in_any_app
    results = [task.delay(0.1, i) for i in range(4)]
    cluster.wait_for(
        lambda: all(eta_countdowns(events, r.id) for r in results), 20, "4 countdown retries"
    )
    assert sem.status().parked_count == 0
    assert set(states(sem).values()) <= {"asking"}
    blocker.release()
    assert sorted(r.get(timeout=30) for r in results) == list(range(4))
    assert max_overlap(cluster.events()) == 1
