"""Celery workers on RabbitMQ with the semaphores in PostgreSQL (a cluster of the
session's own): no Redis in the semaphores' path (the harness keeps results and its
event log in Redis). A refused task parks in a parking queue of RabbitMQ, its place in
line in PostgreSQL (`durability.Where.BROKER`), or waits in place in its worker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery_harness import max_overlap
from cluster_tools import Clusters

from celery_semaphore import Semaphore

pytestmark = pytest.mark.slow

AMQP = "amqp://guest:guest@127.0.0.1:5672"


@pytest.fixture
def clusters(celery_cluster: Any) -> Iterator[Clusters]:
    with Clusters(celery_cluster) as made:
        yield made


@pytest.fixture
def postgres_url(postgres_session_server: Any) -> Iterator[str]:
    name = f"cs_{uuid.uuid4().hex[:12]}"
    postgres_session_server.create_database(name)
    yield postgres_session_server.url_for(name)
    postgres_session_server.drop_database(name)


def test_the_cap_holds_with_rabbitmq_and_postgresql(
    clusters: Clusters, rabbitmq_vhost: str, postgres_url: str
) -> None:
    suffix = uuid.uuid4().hex[:8]
    queue = f"cs-{suffix}"
    cluster = clusters(
        limit=2,
        broker_url=f"{AMQP}/{rabbitmq_vhost}",
        extra_conf={"semaphore_redis_url": postgres_url, "semaphore_backoff_max": 0.3},
    )
    for name in ("p1", "p2"):
        cluster.worker(f"{name}-{suffix}", concurrency=2, queues=queue)
    hold = cluster.app_module.hold
    results = [hold.apply_async((0.3, i), queue=queue) for i in range(8)]
    assert [r.get(timeout=60) for r in results] == list(range(8))
    events = cluster.events()
    assert len(events) == 16
    assert max_overlap(events) == 2, "never more than the limit at once, and it was reached"
    sem = Semaphore(postgres_url, "hold", 2)
    status = sem.status()
    sem.close()
    assert status.declared_limit == 2, "the workers' semaphore lives in PostgreSQL"
    assert (status.holder_count, status.waiter_count) == (0, 0)


def test_kept_permits_on_postgresql_start_tasks_with_no_call_and_come_back_for_a_line(
    clusters: Clusters, rabbitmq_vhost: str, postgres_url: str
) -> None:
    """A process keeps its permit between tasks in PostgreSQL too (`semaphore_keep_idle`):
    its next tasks call no function; a line forming (NOTIFY 'k') brings it back."""
    suffix = uuid.uuid4().hex[:8]
    cluster = clusters(
        limit=1,
        broker_url=f"{AMQP}/{rabbitmq_vhost}",
        extra_conf={"semaphore_redis_url": postgres_url, "semaphore_keep_idle": 30.0},
    )
    cluster.worker(f"k1-{suffix}", concurrency=1, queues=f"q1-{suffix}")
    cluster.worker(f"k2-{suffix}", concurrency=1, queues=f"q2-{suffix}")
    hold = cluster.app_module.hold
    sem = Semaphore(postgres_url, "hold", 1)
    try:
        hold.apply_async((0.0, "keeper"), queue=f"q1-{suffix}").get(timeout=30)
        cluster.wait_for(
            lambda: [h.holder for h in sem.status().holders if h.holder.startswith("kept|")],
            5,
            "the permit kept in PostgreSQL",
        )
        waiter = hold.apply_async((0.0, "waiter"), queue=f"q2-{suffix}")
        asked = time.time()
        waiter.get(timeout=30)
        started = next(e["at"] for e in cluster.events() if e["tag"] == "waiter")
        assert started - asked < 3.0, "the kept permit came back for the line (idle time: 30 s)"
        assert max_overlap(cluster.events()) == 1
    finally:
        sem.close()
