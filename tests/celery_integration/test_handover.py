"""Handover mode (the default) in real ``celery worker`` processes.

A task refused a permit away from the head of the line parks: its retry message
waits in the semaphore's Redis, the execution ends as a retry that publishes
nothing, and the process that frees a permit publishes it when its turn comes.
A new task whose place is already far back when it is published is parked
then and there, and reaches no worker before its turn.
Covered: each runs once and in line order, with no countdown message; the
publisher dying between selection and publish; a stale copy dropped; revoke of
a parked task; a worker SIGKILLed while holding a permit; the semaphores' Redis
losing its data while tasks are parked in the broker; RabbitMQ; a queue cap plus
a task cap; FIFO over a backlog of 500; the semaphores on a Redis Cluster.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery_harness import max_overlap
from cluster_tools import Clusters, eta_countdowns
from test_brokers_canvas import AMQP

from celery_semaphore import Handover, Permit, Semaphore
from celery_semaphore.formats import Gate, parking_queue
from celery_semaphore.parked_tasks import publish
from celery_semaphore.parking_queues import BrokerLink
from devkit.redis_servers import RedisClusterServers, RedisServer

pytestmark = pytest.mark.slow

BEAT = 0.3
# No waiting in place: every refused task parks; the heartbeat looks after parked
# tasks every BEAT seconds; a handed-over task that has not arrived after 1.5 s
# is published again.
PARKING = {
    "semaphore_max_block": 0.0,
    "semaphore_heartbeat_interval": BEAT,
    "semaphore_handover_deadline": 1.5,
}
NOT_PARKED_WARNING = "waiting tasks do not park in the Redis at"


@pytest.fixture
def clusters(celery_cluster: Any) -> Iterator[Clusters]:
    with Clusters(celery_cluster) as made:
        yield made


def block(cluster: Any, name: str = "hold", limit: int = 1, number: int = 0) -> Permit:
    permit = cluster.semaphore(name, limit).attempt(holder=f"test-blocker-{name}-{number}")
    assert isinstance(permit, Permit)
    return permit


def states(sem: Semaphore) -> dict[str, str]:
    return {w.holder: w.state for w in sem.status().waiters}


def wait_parked(cluster: Any, sem: Semaphore, ids: list[str]) -> None:
    cluster.wait_for(
        lambda: states(sem) == dict.fromkeys(ids, "parked"), 20, f"{len(ids)} tasks parked"
    )


def starts(cluster: Any, task_id: str | None = None) -> list[Any]:
    records = sorted(cluster.events(), key=lambda e: e["at"])
    return [
        e["tag"]
        for e in records
        if e["event"] == "start" and (task_id is None or e["id"] == task_id)
    ]


def test_parked_tasks_run_once_each_in_line_order_and_wait_without_a_message(
    clusters: Clusters,
) -> None:
    """Limit 1, held: the first task's turn is near, so it is published, reaches the
    worker, is refused and parks there (RETRY); the others are far back in line, so
    they are parked at publish and reach no worker before their turn (PENDING)."""
    cluster = clusters(limit=1, extra_conf=PARKING)
    events = clusters.events(cluster)
    cluster.worker("w1", concurrency=3, extra=["-E"])
    sem = cluster.semaphore("hold", 1)
    blocker = block(cluster)
    hold = cluster.app_module.hold
    results = [hold.delay(0.1, i) for i in range(6)]
    near, far = results[0], results[1:]
    wait_parked(cluster, sem, [r.id for r in results])
    time.sleep(4 * BEAT)
    assert cluster.events() == []
    assert states(sem) == {r.id: "parked" for r in results}, "parked tasks moved"
    # Nothing waits in the broker or in a worker: one delivery of the near one, none
    # of the far ones, no ETA.
    assert events.received_retries(near.id) == [0]
    assert near.state == "RETRY"
    for result in far:
        assert events.received_retries(result.id) == []
        assert result.state == "PENDING"
    for result in results:
        assert eta_countdowns(events, result.id) == []

    blocker.release()
    assert [r.get(timeout=30) for r in results] == list(range(6))
    assert starts(cluster) == list(range(6))
    assert max_overlap(cluster.events()) == 1
    assert events.received_retries(near.id) == [0, 1]  # parked once, handed over once
    for result in far:
        assert events.received_retries(result.id) == [0]  # delivered once: handed over
    for result in results:
        assert eta_countdowns(events, result.id) == []
    status = sem.status()
    assert (status.holder_count, status.waiter_count, status.parked_count) == (0, 0, 0)


def test_a_backlog_parked_at_publish_starts_in_publish_order(clusters: Clusters) -> None:
    """Limit 1, held: 30 tasks published in a loop, all but the first parked at publish
    (from the third on, taking the place and parking in one script call). Their tickets
    follow publish order, and once the permit frees they start exactly in that order,
    each delivered once."""
    cluster = clusters(limit=1, extra_conf=PARKING)
    events = clusters.events(cluster)
    cluster.worker("w1", concurrency=3, extra=["-E"])
    sem = cluster.semaphore("hold", 1)
    blocker = block(cluster)
    hold = cluster.app_module.hold
    results = [hold.delay(0.02, i) for i in range(30)]
    wait_parked(cluster, sem, [r.id for r in results])
    tickets = {w.holder: w.ticket for w in sem.status().waiters}
    in_order = [tickets[r.id] for r in results]
    assert in_order == sorted(set(in_order)), "tickets follow publish order"

    blocker.release()
    assert [r.get(timeout=60) for r in results] == list(range(30))
    assert starts(cluster) == list(range(30))
    assert max_overlap(cluster.events()) == 1
    for result in results[1:]:
        assert events.received_retries(result.id) == [0]  # delivered once: handed over
        assert eta_countdowns(events, result.id) == []


def test_a_message_parked_at_publish_is_published_as_the_producer_would_have_sent_it(
    clusters: Clusters,
) -> None:
    """Custom headers, expiry, priority, parent and root ids (a task published from
    inside a task) and callbacks (a chain) survive parking at publish."""
    cluster = clusters(limit=1, extra_conf=PARKING)
    cluster.worker("w1", concurrency=3)
    sem = cluster.semaphore("hold", 1)
    blocker = block(cluster)
    tasks = cluster.app_module
    near = tasks.request_seen.delay("near")
    far = tasks.request_seen.apply_async(
        ("far",), headers={"x-test": "kept"}, expires=300, priority=3
    )
    spawner = tasks.spawn_request_seen.delay("child")
    child = tasks.request_seen.AsyncResult(spawner.get(timeout=20))
    chained = (tasks.limited_add.s(1, 2, 0.05) | tasks.limited_add.s(10, 0.05)).delay()
    parked_at_publish = [far.id, child.id, chained.parent.id]
    wait_parked(cluster, sem, [near.id, *parked_at_publish])
    for task_id in parked_at_publish:
        assert tasks.app.AsyncResult(task_id).state == "PENDING", "it reached a worker"

    blocker.release()
    seen_far = far.get(timeout=30)
    assert seen_far["header"] == "kept"
    assert seen_far["expires"] is not None
    assert seen_far["priority"] == 3
    assert seen_far["retries"] == 0
    seen_child = child.get(timeout=30)
    assert seen_child["parent_id"] == seen_child["root_id"] == spawner.id
    assert chained.get(timeout=30) == 13
    assert near.get(timeout=30)["tag"] == "near"
    assert max_overlap(cluster.events()) == 1


def test_the_publisher_dying_between_selection_and_publish_delays_the_task_by_the_deadline_only(
    clusters: Clusters,
) -> None:
    """A process frees a permit, its release selects the next parked task, and it
    dies before publishing it: a worker's heartbeat publishes it after the deadline.
    Then the lost first copy turns up after all: it is dropped, not run."""
    cluster = clusters(limit=1, extra_conf=PARKING)
    worker = cluster.worker("w1", concurrency=2)
    sem = cluster.semaphore("hold", 1)
    block(cluster)
    result = cluster.app_module.hold.delay(0.1, "once")
    wait_parked(cluster, sem, [result.id])

    selected: list[Handover] = []
    dying = Semaphore(
        cluster.state_url, "hold", 1, on_handover=selected.extend, handover_deadline=1.5
    )
    released_at = time.monotonic()
    assert dying.release("test-blocker-hold-0") is True  # ...and it never publishes
    dying.close()
    assert [h.holder for h in selected] == [result.id]
    assert states(sem) == {result.id: "handed over"}

    assert result.get(timeout=20) == "once"
    took = time.monotonic() - released_at
    assert 1.5 <= took < 1.5 + BEAT + 2.0, took
    assert starts(cluster, result.id) == ["once"]

    app = cluster.app_module.app
    publish(app, sem, selected[0], BrokerLink(app))  # the stale copy after all
    line = f"[{result.id}]: dropped another copy of this task"
    cluster.wait_for(lambda: line in worker.text(), 10, "the stale copy dropped")
    time.sleep(0.5)
    assert starts(cluster, result.id) == ["once"], "ran twice"
    assert sem.status().waiter_count == 0


def test_a_revoked_parked_task_is_never_published_again_and_its_place_goes(
    clusters: Clusters,
) -> None:
    cluster = clusters(limit=1, extra_conf=PARKING)
    events = clusters.events(cluster)
    cluster.worker("w1", concurrency=2, extra=["-E"])
    sem = cluster.semaphore("hold", 1)
    blocker = block(cluster)
    hold = cluster.app_module.hold
    revoked, kept = hold.delay(0.1, "revoked"), hold.delay(0.1, "kept")
    wait_parked(cluster, sem, [revoked.id, kept.id])

    cluster.app_module.app.control.revoke(revoked.id)
    cluster.wait_for(lambda: list(states(sem)) == [kept.id], 5, "the revoked one left the line")
    blocker.release()
    assert kept.get(timeout=20) == "kept"
    time.sleep(1.0)
    assert starts(cluster) == ["kept"]
    assert events.received_retries(revoked.id) == [0], "the revoked task was published again"


def test_a_worker_killed_while_holding_a_permit_lets_the_next_parked_task_run_after_the_lease(
    clusters: Clusters,
) -> None:
    lease = 2.0
    # No prefetch: a busy worker must not take "next" (handed over early, before its
    # turn) into its buffer, where the kill would take it too.
    conf = {**PARKING, "worker_disable_prefetch": True}
    cluster = clusters(limit=1, lease=lease, extra_conf=conf)
    victim = cluster.worker("w1", concurrency=1)
    sem = cluster.semaphore("hold", 1)
    hold = cluster.app_module.hold
    long = hold.delay(60, "long")
    cluster.wait_for(lambda: starts(cluster) == ["long"], 20, "the long task started")
    # Only now the second worker: with both up, the long task could start on it, and
    # killing the victim would free nothing.
    cluster.worker("w2", concurrency=1)
    nxt = hold.delay(0.1, "next")
    wait_parked(cluster, sem, [nxt.id])

    victim.kill_all()  # the whole worker: nobody hears of it, nobody releases
    killed_at = time.monotonic()
    assert nxt.get(timeout=20) == "next"
    took = time.monotonic() - killed_at
    assert took < lease + BEAT + 2.0, took
    assert starts(cluster) == ["long", "next"]
    assert long.state != "SUCCESS"


def test_the_semaphores_redis_losing_its_data_loses_no_task_parked_in_the_broker(
    clusters: Clusters,
) -> None:
    """docs/guarantees.md ("Nothing lost"): on a Redis broker, the semaphores in a Redis
    of their own without persistence, waiting tasks park in the broker's parking lists.
    That Redis restarts empty while they are parked: a worker gives them their places
    again (celery_semaphore/worker/parked_rebuild.py); each runs once, never two at
    once, no ERROR says they are lost, and the semaphore works on for new tasks."""
    with RedisServer() as semaphores:
        conf = {**PARKING, "semaphore_redis_url": semaphores.url}
        cluster = clusters(limit=1, extra_conf=conf)
        worker = cluster.worker("w1", concurrency=2)
        sem = Semaphore(semaphores.url, "hold", 1)
        assert isinstance(sem.attempt("test-blocker"), Permit)
        hold = cluster.app_module.hold
        parked = [hold.delay(0.1, f"parked{i}") for i in range(4)]
        wait_parked(cluster, sem, [r.id for r in parked])
        broker = redis.Redis.from_url(cluster.broker_url)
        lists = [parking_queue("default", Gate("hold", 1), asked=a) for a in (False, True)]
        assert sum(broker.llen(name) for name in lists) == 4, "parked in the broker"
        time.sleep(3 * BEAT)  # the heartbeat has seen them parked
        assert cluster.events() == []

        semaphores.restart()  # no persistence: the places and the blocker are gone
        assert sorted(r.get(timeout=30) for r in parked) == [f"parked{i}" for i in range(4)]
        fresh = [hold.delay(0.1, f"new{i}") for i in range(2)]
        assert [r.get(timeout=30) for r in fresh] == ["new0", "new1"]
        time.sleep(1.0)  # a second run would show by now
        ran = starts(cluster)
        assert sorted(ran) == sorted([*(f"parked{i}" for i in range(4)), "new0", "new1"])
        assert max_overlap(cluster.events()) == 1
        assert sum(broker.llen(name) for name in lists) == 0
        broker.close()
        sem.close()
    text = worker.text()
    assert "lost its data; no permit is granted until" in text, "the loss was noticed"
    assert "parked in the broker their places in line again" in text
    assert "the tasks parked there are lost" not in text
    assert NOT_PARKED_WARNING not in text


def test_handover_on_the_rabbitmq_broker(clusters: Clusters, rabbitmq_vhost: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    queue = f"cs-hand-{suffix}"
    cluster = clusters(limit=1, broker_url=f"{AMQP}/{rabbitmq_vhost}", extra_conf=PARKING)
    cluster.worker(f"r1-{suffix}", concurrency=3, queues=queue)
    sem = cluster.semaphore("hold", 1)
    blocker = block(cluster)
    hold = cluster.app_module.hold
    results = [hold.apply_async((0.1, i), queue=queue) for i in range(4)]
    wait_parked(cluster, sem, [r.id for r in results])
    blocker.release()
    assert [r.get(timeout=30) for r in results] == list(range(4))
    assert starts(cluster) == list(range(4))
    assert max_overlap(cluster.events()) == 1


def test_a_queue_cap_and_a_task_cap_each_park_and_hand_over(clusters: Clusters) -> None:
    cluster = clusters(limit=1, queue_limits={"reports": 2}, extra_conf=PARKING)
    cluster.worker("w1", concurrency=4, queues="reports,default")
    queue_sem, own_sem = cluster.semaphore("queue:reports", 2), cluster.semaphore("hold", 1)
    queue_blockers = [block(cluster, "queue:reports", 2) for _ in range(1)]
    own_blocker = block(cluster)
    tasks = cluster.app_module
    plain = [tasks.plain.apply_async((0.2, f"p{i}"), queue="reports") for i in range(3)]
    limited = [tasks.hold.apply_async((0.2, f"h{i}"), queue="reports") for i in range(2)]
    cluster.wait_for(lambda: len(states(queue_sem)) + len(states(own_sem)) >= 4, 20, "tasks parked")
    own_blocker.release()
    for blocker in queue_blockers:
        blocker.release()
    assert [r.get(timeout=30) for r in plain] == ["p0", "p1", "p2"]
    assert [r.get(timeout=30) for r in limited] == ["h0", "h1"]
    events = cluster.events()
    assert max_overlap(events) <= 2
    assert max_overlap([e for e in events if e["task"] == "limited_app.hold"]) == 1
    assert len([e for e in events if e["event"] == "start"]) == 5
    for sem in (queue_sem, own_sem):
        assert sem.status().waiter_count == 0


@pytest.mark.chaos
def test_fifo_over_a_backlog_of_500(clusters: Clusters) -> None:
    """500 tasks parked while the permits are taken start in submission order once
    they free up: none starts before a task submitted more than two limits earlier.
    (While a flood of messages is still on its way to the workers, a place taken at
    publish can lapse before its task is first delivered, and later tickets may then
    pass it: see "Strict FIFO only among live places" in docs/guarantees.md.)"""
    limit = 2
    cluster = clusters(limit=limit, extra_conf={"semaphore_heartbeat_interval": BEAT})
    for name in ("w1", "w2"):
        cluster.worker(name, concurrency=4)
    blockers = [block(cluster, "hold", limit, n) for n in range(limit)]
    hold = cluster.app_module.hold
    results = [hold.delay(0.02, i) for i in range(500)]  # bodies long enough that a
    sem = cluster.semaphore("hold", limit)  # process stalling a few ms reorders no starts
    cluster.wait_for(lambda: sem.status().parked_count == 500, 120, "all 500 parked")
    for blocker in blockers:
        blocker.release()
    assert [r.get(timeout=120) for r in results] == list(range(500))
    order = starts(cluster)
    assert sorted(order) == list(range(500)), "a task ran twice or not at all"
    late = [
        (order[i], order[j])
        for i in range(len(order))
        for j in range(i + 1, min(len(order), i + 50))
        if order[i] > order[j] + 2 * limit
    ]
    assert late == [], late[:10]
    assert max_overlap(cluster.events()) == limit


def test_a_parked_acks_late_task_runs_once(clusters: Clusters) -> None:
    cluster = clusters(limit=1, extra_conf=PARKING)
    cluster.worker("w1", concurrency=2)
    sem = cluster.semaphore("hold", 1)
    blocker = block(cluster)
    late = cluster.app_module.hold_late.delay(0.1, "late")
    wait_parked(cluster, sem, [late.id])
    blocker.release()
    assert late.get(timeout=20) == "late"
    assert starts(cluster) == ["late"]


def test_warm_shutdown_leaves_parked_tasks_parked_for_the_next_worker(clusters: Clusters) -> None:
    cluster = clusters(limit=1, extra_conf=PARKING)
    first = cluster.worker("w1", concurrency=2)
    sem = cluster.semaphore("hold", 1)
    blocker = block(cluster)
    result = cluster.app_module.hold.delay(0.1, "survivor")
    wait_parked(cluster, sem, [result.id])
    first.signal(signal.SIGTERM)
    assert first.wait_exit() == 0
    cluster.worker("w2", concurrency=2)
    blocker.release()  # by the test: no publisher; w2's heartbeat hands it over
    assert result.get(timeout=20) == "survivor"
    assert starts(cluster) == ["survivor"]


def test_a_message_too_large_to_park_falls_back_to_countdown_retries(clusters: Clusters) -> None:
    conf = {**PARKING, "semaphore_park_max_bytes": 10, "semaphore_backoff_max": 0.3}
    cluster = clusters(limit=1, extra_conf=conf)
    events = clusters.events(cluster)
    cluster.worker("w1", concurrency=2, extra=["-E"])
    sem = cluster.semaphore("hold", 1)
    blocker = block(cluster)
    result = cluster.app_module.hold.delay(0.1, "big")
    cluster.wait_for(lambda: len(eta_countdowns(events, result.id)) >= 2, 20, "2 countdowns")
    assert states(sem) in ({}, {result.id: "asking"}), "it parked"
    blocker.release()
    assert result.get(timeout=20) == "big"
    assert starts(cluster, result.id) == ["big"]


def test_handover_with_the_semaphores_on_redis_cluster(
    clusters: Clusters, redis_cluster: RedisClusterServers
) -> None:
    """The broker is a plain Redis, the semaphores a Redis Cluster: tasks take their
    places there (their messages park in the broker's parking lists), a worker's
    heartbeat hands the first over when a permit frees outside any worker, the
    releases of the workers' tasks hand over the others, and each runs once, in line
    order."""
    url = redis_cluster.url.replace("redis://", "redis+cluster://")
    cluster = clusters(limit=1, extra_conf={**PARKING, "semaphore_redis_url": url})
    cluster.worker("w1", concurrency=3)
    sem = Semaphore(url, "hold", 1)
    try:
        blocker = sem.attempt("test-blocker")
        assert isinstance(blocker, Permit)
        hold = cluster.app_module.hold
        results = [hold.delay(0.1, i) for i in range(4)]
        wait_parked(cluster, sem, [r.id for r in results])
        assert sem.status().parked_count == 4
        time.sleep(3 * BEAT)
        assert cluster.events() == []

        assert blocker.release()  # by a client that publishes nothing
        assert [r.get(timeout=30) for r in results] == list(range(4))
        assert starts(cluster) == list(range(4))
        assert max_overlap(cluster.events()) == 1
        status = sem.status()
        assert (status.holder_count, status.waiter_count, status.parked_count) == (0, 0, 0)
    finally:
        sem.close()
