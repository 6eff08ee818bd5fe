"""Waiting in the broker: on RabbitMQ a waiting task's message waits in a parking queue.

Real workers on the machine's RabbitMQ (a private vhost per module), the
semaphores in the test's own Redis (not the broker's, no AOF: before parking
queues, tasks there waited as countdown retries). What an observer sees: every
task runs once, never more than the limit at once, messages wait in the parking
queue while the line is long, and nothing is lost when the process moving a
message fails, when a parked task is revoked, or when the semaphores' Redis
restarts empty.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery_harness import max_overlap
from cluster_tools import Clusters
from kombu import Connection

from celery_semaphore.formats import Gate, parking_queue
from celery_semaphore.parking_queues import parking_queue_entity

pytestmark = pytest.mark.slow

AMQP = "amqp://guest:guest@127.0.0.1:5672"


@pytest.fixture
def clusters(celery_cluster: Any) -> Iterator[Clusters]:
    with Clusters(celery_cluster) as made:
        yield made


def parked_messages(broker_url: str, queue: str, semaphore: str = "hold") -> int:
    """Messages in ``queue``'s parking queue of ``semaphore`` (0 before it exists)."""
    name = parking_queue(queue, Gate(semaphore, 1))
    with Connection(broker_url) as connection:
        entity = parking_queue_entity(name).bind(connection.default_channel)
        try:
            return int(entity.queue_declare(passive=True).message_count)
        except Exception:  # not declared yet
            return 0


def starts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((e for e in events if e["event"] == "start"), key=lambda e: e["at"])


def kendall_tau(order: list[int]) -> float:
    pairs = concordant = 0
    for i in range(len(order)):
        for j in range(i + 1, len(order)):
            pairs += 1
            concordant += 1 if order[i] < order[j] else -1
    return concordant / pairs if pairs else 1.0


def test_a_backlog_waits_in_a_parking_queue_and_runs_in_order(
    clusters: Clusters, rabbitmq_vhost: str
) -> None:
    suffix = uuid.uuid4().hex[:8]
    queue, broker = f"pq-{suffix}", f"{AMQP}/{rabbitmq_vhost}"
    cluster = clusters(limit=2, broker_url=broker)
    for name in ("p1", "p2"):
        cluster.worker(f"{name}-{suffix}", concurrency=2, queues=queue)
    hold = cluster.app_module.hold
    results = [hold.apply_async((0.15, i), queue=queue) for i in range(40)]
    cluster.wait_for(lambda: parked_messages(broker, queue) > 10, 20, "messages parked")
    assert [r.get(timeout=120) for r in results] == list(range(40))
    events = cluster.events()
    started = starts(events)
    assert len(started) == 40  # each ran once
    assert max_overlap(events) == 2
    assert kendall_tau([e["tag"] for e in started]) >= 0.9
    assert parked_messages(broker, queue) == 0
    status = cluster.semaphore("hold", 2).status()
    assert (status.holder_count, status.waiter_count) == (0, 0)


def test_a_parked_task_revoked_never_runs(clusters: Clusters, rabbitmq_vhost: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    queue, broker = f"pr-{suffix}", f"{AMQP}/{rabbitmq_vhost}"
    cluster = clusters(limit=1, broker_url=broker)
    cluster.worker(f"r1-{suffix}", concurrency=2, queues=queue)
    tasks = cluster.app_module
    first = tasks.hold_until_opened.apply_async(("first",), queue=queue)
    cluster.wait_for(lambda: cluster.started(first.id), 20, "the first task started")
    waiting = [tasks.hold.apply_async((0.05, i), queue=queue) for i in range(6)]
    cluster.wait_for(lambda: parked_messages(broker, queue) >= 4, 20, "messages parked")
    revoked = waiting[3]
    revoked.revoke()
    time.sleep(1.0)  # the worker hears of the revoke
    cluster.redis.set("open:first", 1)
    assert first.get(timeout=30) == "first"
    for i, result in enumerate(waiting):
        if result is not revoked:
            assert result.get(timeout=60) == i
    time.sleep(1.0)
    ran = {e["id"] for e in cluster.events() if e["event"] == "start"}
    assert revoked.id not in ran
    assert len(ran) == 6
    assert parked_messages(broker, queue) == 0
