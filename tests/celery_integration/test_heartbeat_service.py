"""The heartbeat as a plain service, driven without a worker: a real Redis, a Celery
app on the in-memory broker, and a list of running requests the test controls."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery import Celery

import celery_semaphore
from celery_semaphore import LimitedTask, Permit, Semaphore
from celery_semaphore.gates import GATES_HEADER, Gate, encode_gates
from celery_semaphore.signals import permit_lost
from celery_semaphore.worker.heartbeat import Heartbeat

LEASE = 0.6


@dataclass
class Running:
    """What the heartbeat reads of a worker Request."""

    id: str
    task: Any
    time_start: float
    hostname: str = "test@host"
    request_dict: dict[str, Any] = field(default_factory=dict)


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    app = Celery("heartbeat_service", broker="memory://", set_as_current=False)
    app.conf.update(semaphore_redis_url=redis_url, semaphore_lease_timeout=LEASE)
    yield app
    celery_semaphore.reset(app)
    app.close()


def running(app: Celery, holder: str, started: float) -> Running:
    task = app.tasks["hb.job"]
    gates = encode_gates([Gate("hb", 2)])
    return Running(holder, task, started, request_dict={GATES_HEADER: gates})


def define_task(app: Celery) -> None:
    @app.task(base=LimitedTask, semaphore="hb", limit=2, name="hb.job", shared=False)
    def job() -> None: ...


def test_it_keeps_running_permits_alive_and_lets_them_lapse_once_stopped(
    app: Celery, redis_url: str
) -> None:
    define_task(app)
    sem = Semaphore(redis_url, "hb", 2, lease_timeout=LEASE)
    permit = sem.attempt("task-1")
    assert isinstance(permit, Permit)
    requests = [running(app, "task-1", time.time())]
    heartbeat = Heartbeat(app, lambda: requests, interval=LEASE / 4)
    heartbeat.start()
    try:
        time.sleep(LEASE * 3)
        assert [h.holder for h in sem.status().holders] == ["task-1"], "the lease ran out"
    finally:
        heartbeat.stop()
    time.sleep(LEASE * 1.5)
    assert sem.status().holder_count == 0, "renewed after stop()"
    sem.close()


def test_drain_renews_until_nothing_runs(app: Celery, redis_url: str) -> None:
    define_task(app)
    sem = Semaphore(redis_url, "hb", 2, lease_timeout=LEASE)
    assert isinstance(sem.attempt("task-1"), Permit)
    requests = [running(app, "task-1", time.time())]
    heartbeat = Heartbeat(app, lambda: list(requests), interval=LEASE / 4)
    heartbeat.start()
    heartbeat.stop(drain=True)
    time.sleep(LEASE * 2)
    assert sem.status().holder_count == 1, "draining stopped renewing a running task"
    requests.clear()
    time.sleep(LEASE)
    assert not heartbeat.alive, "still running with nothing to renew"
    sem.close()


def test_a_lost_permit_of_a_running_body_is_reported_once(app: Celery, redis_url: str) -> None:
    define_task(app)
    sem = Semaphore(redis_url, "hb", 2, lease_timeout=LEASE)
    assert isinstance(sem.attempt("task-1"), Permit)
    assert isinstance(sem.attempt("task-2"), Permit)
    long_ago = time.time() - 60  # past the time it may take to acquire
    requests = [running(app, "task-1", long_ago), running(app, "task-2", long_ago)]
    heartbeat = Heartbeat(app, lambda: requests, interval=60)
    reports: list[dict[str, Any]] = []

    def collect(sender: Any = None, **fields: Any) -> None:
        reports.append(fields)

    permit_lost.connect(collect, weak=False)
    try:
        sem.release("task-2")
        heartbeat.beat()
        heartbeat.beat()
    finally:
        permit_lost.disconnect(collect)
    assert [(r["task_id"], r["semaphore"]) for r in reports] == [("task-2", "hb")]
    sem.close()
