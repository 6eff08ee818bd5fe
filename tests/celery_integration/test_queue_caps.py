"""Per-queue caps (``semaphore_queue_limits``) in real ``celery worker`` processes.

Every task consumed from a capped queue passes the queue's gate
(``queue:<name>``), plain tasks included; a LimitedTask passes both gates
and never holds one permit while it waits for the other; other queues are
not capped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery_harness import max_overlap
from cluster_tools import Clusters

from celery_semaphore import Permit
from celery_semaphore.core.redis.scripts import source

pytestmark = pytest.mark.slow

# prefetch 1: each worker reserves no more than it can run, so uncapped tasks spread out
WORKER = {"concurrency": 2, "queues": "reports,default", "extra": ["--prefetch-multiplier=1"]}


@pytest.fixture
def clusters(celery_cluster: Any) -> Iterator[Clusters]:
    with Clusters(celery_cluster) as made:
        yield made


def of(events: list[dict[str, Any]], ids: set[str]) -> list[dict[str, Any]]:
    return [e for e in events if e["id"] in ids]


def test_queue_cap_holds_plain_tasks_across_workers_and_spares_other_queues(
    clusters: Clusters,
) -> None:
    cluster = clusters(limit=3, queue_limits={"reports": 2})
    workers = [cluster.worker(name, **WORKER) for name in ("w1", "w2")]
    plain = cluster.app_module.plain
    capped = [plain.apply_async((0.3, f"r{i}"), queue="reports") for i in range(8)]
    assert [r.get(timeout=60) for r in capped] == [f"r{i}" for i in range(8)]
    free = [plain.apply_async((1.0, f"d{i}"), queue="default") for i in range(4)]
    assert [r.get(timeout=30) for r in free] == [f"d{i}" for i in range(4)]

    events = cluster.events()
    capped_runs = of(events, {r.id for r in capped})
    assert len(capped_runs) == 16
    assert max_overlap(capped_runs) == 2
    pids = {e["pid"] for e in capped_runs}
    assert all(pids & set(w.children()) for w in workers)  # both workers ran capped tasks
    # not capped: more than the 2 of queue:reports ran at once (all 4 when both workers
    # reserve 2 each; the Redis transport may hand one worker 3, leaving one process idle)
    assert max_overlap(of(events, {r.id for r in free})) >= 3
    status = cluster.semaphore("queue:reports", 2).status()
    assert (status.holder_count, status.waiter_count) == (0, 0)


def test_limited_task_on_a_capped_queue_holds_both_permits_and_waits_holding_neither(
    clusters: Clusters,
) -> None:
    cluster = clusters(
        limit=3, queue_limits={"reports": 2}, extra_conf={"semaphore_max_block": 1.0}
    )
    cluster.worker("w1", **{**WORKER, "concurrency": 4})
    hold = cluster.app_module.hold
    queue_sem, own_sem = cluster.semaphore("queue:reports", 2), cluster.semaphore("hold", 3)

    running = hold.apply_async((1.5, "both"), queue="reports")
    cluster.wait_for(lambda: cluster.started(running.id), 20, "the task started")
    assert running.id in [h.holder for h in queue_sem.status().holders]
    assert running.id in [h.holder for h in own_sem.status().holders]
    assert running.get(timeout=20) == "both"
    assert (queue_sem.status().holder_count, own_sem.status().holder_count) == (0, 0)

    # Its own semaphore is full: the task passes the queue gate, is refused at its own,
    # and must give the queue permit back before it waits (in place or by retrying).
    blockers = [own_sem.attempt(holder=f"test-{i}") for i in range(3)]
    assert all(isinstance(b, Permit) for b in blockers)
    waiting = hold.apply_async((0.1, "waiter"), queue="reports")
    seen: dict[int, list[float]] = {}  # fencing token of its queue permit -> when seen
    in_line = 0
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        for holder in queue_sem.status().holders:
            if holder.holder == waiting.id:
                seen.setdefault(holder.fencing_token, []).append(time.monotonic())
        in_line += waiting.id in [w.holder for w in own_sem.status().waiters]
        time.sleep(0.01)
    longest = max((times[-1] - times[0] for times in seen.values()), default=0.0)
    assert longest < 0.5, f"held queue:reports for {longest:.2f}s while waiting for 'hold'"
    assert in_line > 50  # it was waiting for 'hold' all along
    assert not cluster.started(waiting.id)

    # Meanwhile both queue permits stay usable by plain tasks of the queue.
    plain = [cluster.app_module.plain.apply_async((0.6, i), queue="reports") for i in range(2)]
    assert [r.get(timeout=20) for r in plain] == [0, 1]
    assert max_overlap(of(cluster.events(), {r.id for r in plain})) == 2

    for blocker in blockers:
        assert isinstance(blocker, Permit)
        blocker.release()
    assert waiting.get(timeout=20) == "waiter"
    assert (queue_sem.status().holder_count, own_sem.status().holder_count) == (0, 0)


def test_a_routing_key_unlike_the_queue_name_is_capped_as_its_queue_at_publish_and_in_the_worker(
    clusters: Clusters,
) -> None:
    """The publisher and the worker name the queue the same way: a task sent to
    exchange ``work`` with routing key ``rk.reports`` lands in ``reports``, so its
    place at publish and its permit are both on ``queue:reports``."""
    queues = [["reports", "work", "rk.reports"], ["default", "default", "default"]]
    cluster = clusters(limit=3, queue_limits={"reports": 1}, extra_conf={"task_queues": queues})
    queue_sem = cluster.semaphore("queue:reports", 1)
    blocker = queue_sem.attempt(holder="test-blocker")
    assert isinstance(blocker, Permit)

    # The quick client that takes places at publish gives up after 0.25 s; on a loaded
    # machine the first call to a fresh server (NOSCRIPT, then SCRIPT LOAD) can take longer.
    queue_sem.client.script_load(source("enqueue"))
    app = cluster.app_module.app
    with app.connection_for_write() as connection:  # the binding, before any worker runs
        app.amqp.queues["reports"].bind(connection.default_channel).declare()
    plain = cluster.app_module.plain
    routed = [
        plain.apply_async((0.3, f"r{i}"), exchange="work", routing_key="rk.reports")
        for i in range(3)
    ]
    # No worker runs yet: only the publisher can have put them in line, in order.
    assert [w.holder for w in queue_sem.status().waiters] == [r.id for r in routed]

    cluster.worker("w1", **WORKER)
    time.sleep(1.0)
    assert not any(cluster.started(r.id) for r in routed), "ran without the queue's permit"
    blocker.release()
    assert [r.get(timeout=30) for r in routed] == ["r0", "r1", "r2"]
    runs = of(cluster.events(), {r.id for r in routed})
    assert max_overlap(runs) == 1
    starts = [e["id"] for e in runs if e["event"] == "start"]
    assert starts == [r.id for r in routed], "not served in publish order"
