"""How long a refused task waits in place in a real worker (prefork, threads): up to
``semaphore_max_block`` while another process of its worker is idle, at most 0.1 s
while every other one runs a task; then it parks, and its process is free for the
worker's other work (`celery_semaphore.worker.pool_occupancy`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_tools import Clusters

from celery_semaphore import Permit, Semaphore

pytestmark = pytest.mark.slow

IN_PLACE = "waiting in place"
CONF = {"semaphore_max_block": 10.0, "semaphore_heartbeat_interval": 0.3}


@pytest.fixture
def clusters(celery_cluster: Any) -> Iterator[Clusters]:
    with Clusters(celery_cluster) as made:
        yield made


def state_in_line(sem: Semaphore, task_id: str) -> str | None:
    return next((w.state for w in sem.status().waiters if w.holder == task_id), None)


@pytest.mark.parametrize("pool", ["prefork", "threads"])
@pytest.mark.parametrize("other_process", ["idle", "busy"])
def test_a_task_waits_in_place_long_only_while_another_process_of_its_worker_is_idle(
    clusters: Clusters, other_process: str, pool: str
) -> None:
    cluster = clusters(limit=1, extra_conf=CONF)
    cluster.worker("w1", pool=pool, concurrency=2)
    sem = cluster.semaphore("hold", 1)
    blocker = sem.attempt(holder="test-blocker")
    assert isinstance(blocker, Permit)
    tasks = cluster.app_module
    # both processes run a task and end it first: a process's mark goes with its task
    first = [tasks.plain.delay(0.5, f"first-{i}") for i in range(2)]
    assert [r.get(timeout=20) for r in first] == ["first-0", "first-1"]
    if pool == "prefork":
        pids = {e["pid"] for e in cluster.events() if e["event"] == "start"}
        assert len(pids) == 2, pids
    if other_process == "busy":
        busy = tasks.plain.delay(5, "busy")
        cluster.wait_for(lambda: cluster.started(busy.id), 10, "the plain task running")
    waiting = tasks.hold.delay(0.05, "waiting")
    cluster.wait_for(
        lambda: state_in_line(sem, waiting.id) in (IN_PLACE, "parked"), 10, "the task at a worker"
    )
    time.sleep(1.0)  # ten times the short wait, a tenth of max_block
    expected = IN_PLACE if other_process == "idle" else "parked"
    assert state_in_line(sem, waiting.id) == expected
    if other_process == "busy":  # its process is free again: another task runs there
        assert tasks.plain.delay(0.05, "next").get(timeout=3) == "next"
        assert state_in_line(sem, waiting.id) == "parked"
    blocker.release()
    assert waiting.get(timeout=20) == "waiting"
