"""The cap on the RabbitMQ broker, and limited tasks inside chains, groups and chords.

RabbitMQ runs on this machine (amqp://guest:guest@127.0.0.1:5672//); each run
uses a private vhost (``rabbitmqctl``), else unique queue and node names on
``/``. Results and semaphores stay on the test's own Redis.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import chain, chord, group
from celery_harness import max_overlap
from cluster_tools import Clusters

from celery_semaphore import Permit

pytestmark = pytest.mark.slow

AMQP = "amqp://guest:guest@127.0.0.1:5672"


@pytest.fixture
def clusters(celery_cluster: Any) -> Iterator[Clusters]:
    with Clusters(celery_cluster) as made:
        yield made


def test_cap_holds_on_the_rabbitmq_broker(clusters: Clusters, rabbitmq_vhost: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    queue = f"cs-{suffix}"
    cluster = clusters(limit=2, broker_url=f"{AMQP}/{rabbitmq_vhost}")
    for name in ("r1", "r2"):
        cluster.worker(f"{name}-{suffix}", concurrency=2, queues=queue)
    hold = cluster.app_module.hold
    results = [hold.apply_async((0.3, i), queue=queue) for i in range(8)]
    assert [r.get(timeout=60) for r in results] == list(range(8))
    events = cluster.events()
    assert len(events) == 16
    assert max_overlap(events) == 2
    assert len({e["pid"] for e in events}) > 2  # both workers ran tasks (2 processes each)
    status = cluster.semaphore("hold", 2).status()
    assert (status.holder_count, status.waiter_count) == (0, 0)


def test_limited_tasks_in_a_chain_a_group_and_a_chord(clusters: Clusters) -> None:
    cluster = clusters(
        limit=2, extra_conf={"semaphore_backoff_max": 0.3, "semaphore_max_block": 0.0}
    )
    for name in ("w1", "w2"):
        cluster.worker(name, concurrency=2, extra=["-E"])
    tasks = cluster.app_module
    add = tasks.limited_add
    blockers = [cluster.semaphore("hold", 2).attempt(holder=f"test-{i}") for i in range(2)]
    assert all(isinstance(b, Permit) for b in blockers)

    chained = chain(add.s(1, 2, 0.2), add.s(3, 0.2), add.s(4, 0.2)).apply_async()
    grouped = group(add.s(i, i, 0.2) for i in range(6)).apply_async()
    chorded = chord((add.s(i, 1, 0.2) for i in range(5)), tasks.limited_sum.s()).apply_async()
    first = [r.id for r in grouped.results] + [chained.parent.parent.id]
    sem = cluster.semaphore("hold", 2)
    cluster.wait_for(
        lambda: set(first) <= {w.holder for w in sem.status().waiters if w.state == "parked"},
        20,
        "every task of the group and the chain's first parked (at publish or in a worker)",
    )
    time.sleep(0.5)
    assert cluster.events() == []  # nothing ran while the test held both permits
    for blocker in blockers:
        assert isinstance(blocker, Permit)
        blocker.release()

    assert chained.get(timeout=60) == 10
    assert grouped.get(timeout=60) == [2 * i for i in range(6)]
    assert chorded.get(timeout=60) == sum(i + 1 for i in range(5))
    records = cluster.events()
    assert len([e for e in records if e["event"] == "start"]) == 3 + 6 + 5 + 1  # each ran once
    assert max_overlap(records) == 2
    status = cluster.semaphore("hold", 2).status()
    assert (status.holder_count, status.waiter_count) == (0, 0)
