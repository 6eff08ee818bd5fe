"""Operators steering a semaphore while tasks are parked (handover mode), in real workers.

Draining (``Semaphore.set_draining`` or ``celery semaphore drain``) hands no
parked task over, even when permits free; resuming hands them over in line
order. A raised limit (``set_limit``) hands more parked tasks over at once; a
lowered one admits nobody until the holders drop below it. Each task's body runs
once. What ran, in which order and beside whom comes from the bodies' own
records (the Redis list ``events``, in the order Redis received them).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery_harness import APPS, Cluster
from cluster_tools import Clusters
from test_handover import BEAT, PARKING, block, states, wait_parked

from celery_semaphore import Handover, Semaphore
from celery_semaphore.parked_tasks import Publisher
from celery_semaphore.parking_queues import BrokerLink

pytestmark = pytest.mark.slow


@pytest.fixture
def clusters(celery_cluster: Any) -> Iterator[Clusters]:
    with Clusters(celery_cluster) as made:
        yield made


class Steering:
    """A client of semaphore ``hold`` that publishes what it hands over (as a worker
    does) and remembers to whom, in order."""

    def __init__(self, cluster: Cluster, limit: int) -> None:
        self.handed: list[str] = []
        app = cluster.app_module.app
        self._publish = Publisher(app, BrokerLink(app))
        self.semaphore = Semaphore(
            cluster.state_url,
            "hold",
            limit,
            lease_timeout=cluster.lease,
            on_handover=self._on_handover,
            handover_window=PARKING["semaphore_max_block"],
            handover_deadline=PARKING["semaphore_handover_deadline"],
        )
        self._publish.semaphore = self.semaphore

    def _on_handover(self, handovers: list[Handover]) -> None:
        self.handed.extend(h.holder for h in handovers)
        self._publish(handovers)

    def take(self) -> list[str]:
        taken, self.handed = self.handed, []
        return taken

    def close(self) -> None:
        self.semaphore.close()


def cli(cluster: Cluster, *args: str) -> None:
    """``celery semaphore ARGS`` as an operator runs it, on the cluster's semaphores."""
    env = {**os.environ, "CS_REDIS_URL": cluster.state_url, "PYTHONPATH": str(APPS)}
    command = [sys.executable, "-m", "celery", "-A", "cli_app", "semaphore", *args]
    done = subprocess.run(command, env=env, cwd=APPS, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def body_runs(cluster: Cluster) -> tuple[list[Any], set[Any]]:
    """Tags of the bodies started (in start order) and of those that ended."""
    records = cluster.events()
    return (
        [e["tag"] for e in records if e["event"] == "start"],
        {e["tag"] for e in records if e["event"] == "end"},
    )


def assert_once_in_line_order_within(
    records: list[dict[str, Any]], ids: list[str], limit: int
) -> None:
    """Each task's body ran once, never beside ``limit`` others, and in line order:
    when task n starts, at most ``limit - 1`` of the tasks before it have not ended.
    (Those still hold permits granted before n's; any other earlier task that had
    not ended would have been granted after n, or never, so a grant out of order
    by ``limit`` places or more fails here.) With a limit of 1: the exact order."""
    line = {task_id: n for n, task_id in enumerate(ids)}
    started: list[int] = []
    ended: set[int] = set()
    running: set[int] = set()
    for record in records:
        n = line[record["id"]]
        if record["event"] == "start":
            assert n not in started, f"task {n} ran twice: {started}"
            assert len(running) < limit, f"task {n} started beside {sorted(running)}"
            unfinished = [m for m in range(n) if m not in ended]
            assert len(unfinished) < limit, f"task {n} started before {unfinished} ended"
            started.append(n)
            running.add(n)
        elif record["event"] == "end":
            running.discard(n)
            ended.add(n)
    assert sorted(started) == list(range(len(ids))), f"ran: {started}"


@pytest.mark.parametrize("steer", ["api", "cli"])
def test_draining_hands_no_parked_task_over_and_resuming_runs_each_once_in_line_order(
    clusters: Clusters, steer: str
) -> None:
    """``api``: drain and resume with ``Semaphore.set_draining`` from a client that
    publishes (the resume itself hands over the head of the line); ``cli``: with
    ``celery semaphore drain/resume``, which publishes no task: the resume wakes the
    workers' heartbeats, which hand the parked tasks over."""
    limit = 2
    cluster = clusters(limit=limit, extra_conf=PARKING)
    deliveries = clusters.events(cluster)
    for name in ("w1", "w2"):
        cluster.worker(name, concurrency=2, extra=["-E"])  # room for twice the limit
    sem = cluster.semaphore("hold", limit)
    steering = Steering(cluster, limit)
    blockers = [block(cluster, "hold", limit, n) for n in range(limit)]
    hold = cluster.app_module.hold
    results = [hold.delay(0.3, i) for i in range(5)]
    wait_parked(cluster, sem, [r.id for r in results])

    if steer == "api":
        assert steering.semaphore.set_draining(True) is False
    else:
        cli(cluster, "drain", "hold")
    assert sem.status().draining
    delivered = {r.id: deliveries.received_retries(r.id) for r in results}
    for blocker in blockers:  # by a client that publishes; the workers' heartbeats dispatch too
        assert steering.semaphore.release(blocker.holder) is True
    results.append(hold.delay(0.3, 5))  # arrives during the drain: parks too
    ids = [r.id for r in results]
    wait_parked(cluster, sem, ids)
    time.sleep(4 * BEAT)
    assert cluster.events() == [], "a body started while draining"
    assert states(sem) == dict.fromkeys(ids, "parked"), "a parked task was handed over"
    assert sem.status().holder_count == 0
    assert steering.take() == [], "a release handed a parked task over while draining"
    late = results[-1].id
    assert {i: deliveries.received_retries(i) for i in ids} == {
        **delivered,
        late: deliveries.received_retries(late)[:1],
    }, "a task was delivered again while draining"

    if steer == "api":
        assert steering.semaphore.set_draining(False) is True
        handed = steering.take()
        assert handed[:limit] == ids[:limit], "the resume did not hand over the head of the line"
        assert handed == ids[: len(handed)], handed
    else:
        cli(cluster, "resume", "hold")
    assert not sem.status().draining
    assert [r.get(timeout=30) for r in results] == list(range(6))
    assert_once_in_line_order_within(cluster.events(), ids, limit)
    status = sem.status()
    assert (status.holder_count, status.waiter_count, status.parked_count) == (0, 0, 0)
    steering.close()


def test_a_raised_limit_hands_over_more_parked_tasks_and_a_lowered_one_admits_nobody_until_below(
    clusters: Clusters,
) -> None:
    """Declared limit 2; raised to 4 while six tasks are parked; lowered to 1 while
    four run. Each body holds its permit until the test opens it."""
    cluster = clusters(limit=2, extra_conf=PARKING)
    for name in ("w1", "w2"):
        cluster.worker(name, concurrency=3)  # six processes: more than any limit here
    sem = cluster.semaphore("hold", 2)
    steering = Steering(cluster, 2)
    tags = [f"t{i}" for i in range(8)]
    results = [cluster.app_module.hold_until_opened.delay(tag) for tag in tags]
    ids = [r.id for r in results]

    def open_body(tag: str) -> None:
        cluster.redis.set(f"open:{tag}", 1)

    def running() -> set[Any]:
        started, ended = body_runs(cluster)
        return set(started) - ended

    def holds(task_id: str) -> bool:
        return task_id in {h.holder for h in sem.status().holders}

    def nobody_else_starts(expected: list[str]) -> None:
        time.sleep(4 * BEAT)  # the workers' heartbeats dispatch several times meanwhile
        assert sorted(body_runs(cluster)[0]) == expected, "a task started above the limit"
        assert states(sem) == dict.fromkeys(ids[len(expected) :], "parked")

    cluster.wait_for(lambda: running() == {"t0", "t1"}, 20, "t0 and t1 running")
    wait_parked(cluster, sem, ids[2:])
    nobody_else_starts(tags[:2])

    assert steering.semaphore.set_limit(4) is None
    handed = steering.take()
    assert handed[:2] == ids[2:4], "the raise did not hand over the next two at once"
    assert handed == ids[2 : 2 + len(handed)], handed
    cluster.wait_for(lambda: running() == set(tags[:4]), 20, "four bodies running")
    nobody_else_starts(tags[:4])
    assert sem.status().holder_count == 4

    assert steering.semaphore.set_limit(1) == 4
    assert steering.take() == []
    for n in range(3):
        open_body(tags[n])
        cluster.wait_for(lambda n=n: not holds(ids[n]), 20, f"{tags[n]} released")
        nobody_else_starts(tags[:4])  # 3, 2, then 1 holder left: not below the limit of 1

    open_body("t3")
    cluster.wait_for(lambda: running() == {"t4"}, 20, "t4 running, alone")
    for tag in tags[4:]:
        open_body(tag)
    assert [r.get(timeout=30) for r in results] == tags
    records = cluster.events()
    assert sorted(body_runs(cluster)[0]) == tags, "a body ran twice"
    later = records[next(i for i, e in enumerate(records) if e["tag"] == "t4") :]
    assert {e["tag"] for e in later} == set(tags[4:]), "t0..t3 ran on after t4 started"
    assert_once_in_line_order_within(later, ids[4:], 1)
    status = sem.status()
    assert (status.holder_count, status.waiter_count, status.parked_count) == (0, 0, 0)
    steering.close()
