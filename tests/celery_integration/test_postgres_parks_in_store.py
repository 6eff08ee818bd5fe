"""Celery workers on a PostgreSQL-only stack: kombu's SQLAlchemy transport on PostgreSQL
as the broker, the semaphores in the same database. The broker is neither RabbitMQ nor
Redis, so a waiting task parks in PostgreSQL itself (`durability.Where.STORE`): its
message is kept in the ``parked`` table beside its place in line and published again to
the broker at its turn (the harness keeps only results and the bodies' records in Redis).

On this transport a message a worker took is marked invisible at once and never comes
back if the worker dies (kombu restores unacknowledged messages only on a clean close),
and the transport polls its queues every second (its transport options all go to
``create_engine``: ``polling_interval`` cannot be set).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from celery.exceptions import TimeoutError as ResultTimeout
from celery_harness import Cluster, max_overlap
from cluster_tools import Clusters

from devkit.measures import kendall_tau

pytestmark = [
    pytest.mark.slow,
    # kombu 5.7's SQL models use ``lazy="noload"``, deprecated by SQLAlchemy 2.1
    pytest.mark.filterwarnings(
        "ignore:The ``noload`` loader strategy is deprecated:sqlalchemy.exc.SADeprecationWarning"
    ),
]


LIMIT = 2
# No waiting in place: every refused task parks. The heartbeat looks after parked tasks
# every 0.3 s; a handed-over task that has not arrived after 3 s (three of the
# transport's polls) is published again.
PARKING = {
    "semaphore_max_block": 0.0,
    "semaphore_heartbeat_interval": 0.3,
    "semaphore_handover_deadline": 3.0,
}


@pytest.fixture
def postgres_url(postgres_session_server: Any) -> Iterator[str]:
    name = f"cs_{uuid.uuid4().hex[:12]}"
    postgres_session_server.create_database(name)
    yield postgres_session_server.url_for(name)
    postgres_session_server.drop_database(name)  # cuts off the transport's engines too


@pytest.fixture
def clusters(postgres_url: str, celery_cluster: Any) -> Iterator[Clusters]:
    """Stops the workers before the database goes (their heartbeat would complain)."""
    with Clusters(celery_cluster) as made:
        yield made


def sql_broker(postgres_url: str) -> str:
    """kombu's SQLAlchemy transport on the database at ``postgres_url`` (psycopg 3)."""
    return "sqla+" + postgres_url.replace("postgresql://", "postgresql+psycopg://", 1)


@dataclass
class Sample:
    at: float
    parked: int  # state 'p': the message waits in PostgreSQL
    handed: int  # state 'h': published at its turn, not arrived yet
    in_broker: int  # messages visible in the broker's queues (not taken by a worker)
    ended: int  # bodies that ended


@dataclass
class Watcher:
    """Reads the semaphores' tables and the broker's table every 50 ms, from outside."""

    url: str
    cluster: Cluster
    samples: list[Sample] = field(default_factory=list)
    ever_parked: set[str] = field(default_factory=set)
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self._stop.wait(0.05):
                    self.look(conn)
        except BaseException as error:  # reported by stop()
            self.error = error

    def look(self, conn: psycopg.Connection[Any]) -> None:
        try:
            parked = conn.execute(
                "SELECT holder, state FROM celery_semaphore.parked WHERE state IN ('p', 'h')"
            ).fetchall()
        except psycopg.errors.UndefinedTable:
            return  # the store makes its tables at its first call
        row = conn.execute("SELECT count(*) FROM kombu_message WHERE visible").fetchone()
        self.ever_parked.update(holder for holder, state in parked if state == "p")
        self.samples.append(
            Sample(
                time.time(),
                parked=sum(1 for _, state in parked if state == "p"),
                handed=sum(1 for _, state in parked if state == "h"),
                in_broker=int(row[0]) if row else 0,
                ended=ended(self.cluster),
            )
        )

    def start(self) -> Watcher:
        self._thread = threading.Thread(target=self.run, name="parked-watcher", daemon=True)
        self._thread.start()
        return self

    def parked_now(self) -> set[str]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT holder FROM celery_semaphore.parked WHERE state = 'p'"
            ).fetchall()
        return {holder for (holder,) in rows}

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        assert self.error is None, f"the watcher failed: {self.error!r}"
        assert self.samples, "the watcher read nothing"


def start_cluster(clusters: Clusters, postgres_url: str, lease: float = 60.0) -> Cluster:
    cluster = clusters(
        limit=LIMIT,
        lease=lease,
        broker_url=sql_broker(postgres_url),
        extra_conf={"semaphore_redis_url": postgres_url, **PARKING},
    )
    # One at a time: each worker's first connection creates the transport's tables
    # and queue rows, which kombu does not guard against a second process doing the same.
    suffix = uuid.uuid4().hex[:6]
    for name in ("s1", "s2"):
        cluster.worker(f"{name}-{suffix}", concurrency=2)
    return cluster


def ended(cluster: Cluster) -> int:
    return sum(1 for e in cluster.events() if e["event"] == "end")


def starts(cluster: Cluster) -> list[dict[str, Any]]:
    return sorted((e for e in cluster.events() if e["event"] == "start"), key=lambda e: e["at"])


def test_a_backlog_parks_in_postgresql_and_runs_once_each_in_order(
    clusters: Clusters, postgres_url: str
) -> None:
    """48 short tasks, limit 2, two workers of two processes: all but the first few are
    parked at publish, in PostgreSQL (no worker holds them, the broker's queue stays
    short), and each is published to the broker at its turn, runs once, in order."""
    total = 48
    cluster = start_cluster(clusters, postgres_url)
    watcher = Watcher(postgres_url, cluster).start()
    hold = cluster.app_module.hold
    began = time.monotonic()
    results = [hold.delay(0.05, i) for i in range(total)]
    published = time.time()
    try:
        cluster.wait_for(lambda: ended(cluster) >= total, 60, f"{total} bodies ended")
    finally:
        watcher.stop()
    assert [r.get(timeout=10) for r in results] == list(range(total))
    elapsed = time.monotonic() - began
    events = cluster.events()
    order = [e["tag"] for e in starts(cluster)]
    peak_parked = max(s.parked for s in watcher.samples)
    # Once all were published, those neither parked in PostgreSQL nor ended: running,
    # handed over on their way, in the broker, or taken by a worker.
    elsewhere = max(
        total - s.parked - s.ended for s in watcher.samples if s.at > published and s.parked
    )
    figures = {
        "seconds": round(elapsed, 1),
        "kendall tau": round(kendall_tau(order), 3),
        "peak parked": peak_parked,
        "ever parked": len(watcher.ever_parked),
        "peak in broker": max(s.in_broker for s in watcher.samples),
        "peak elsewhere while some parked": elsewhere,
    }
    print("figures:", figures)

    assert sorted(order) == list(range(total)), f"a task ran twice or never: {order}"
    assert len(events) == 2 * total
    assert max_overlap(events) == LIMIT, "never more than the limit at once, and it was reached"
    assert kendall_tau(order) >= 0.9, figures

    # Where.STORE: the backlog waited in PostgreSQL, not in the broker nor in a worker.
    assert peak_parked >= total // 2, figures
    assert len(watcher.ever_parked) >= total - 4 * LIMIT, figures
    assert figures["peak in broker"] <= 2 * LIMIT + 2, figures
    assert elsewhere <= 4 * LIMIT + 2, figures
    # No countdown retries: a task parked at publish arrives as it was sent (retries 0);
    # one that waited as countdown retries (or parked at a worker) arrives with more.
    retries = [e["retries"] for e in starts(cluster)]
    assert retries.count(0) >= total - 2 * LIMIT - 2, retries

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        left = conn.execute(
            "SELECT count(*) FROM celery_semaphore.parked WHERE state IN ('p', 'h')"
        ).fetchone()
    assert left == (0,), "parked messages left behind"


def test_a_worker_killed_while_tasks_are_parked_in_postgresql_loses_none_of_them(
    clusters: Clusters, postgres_url: str
) -> None:
    """A backlog parked in PostgreSQL, two workers. Mid-backlog, one worker's pool
    processes freeze (SIGSTOP) while it is idle, so that the handovers it takes from the
    broker go nowhere; once it holds one, it is SIGKILLed with its children. The victim
    is the first worker seen idle after running a parked task: the two workers' polls
    of the transport (every second) can fall so that one of them takes every handover. Every task
    ever parked in PostgreSQL runs, exactly once: a handover the dead worker had taken
    is published again after the handover deadline. Only a body the kill cut may be
    lost (Celery acks a task when it begins), and a message the dead worker had taken
    from the broker without it ever being parked (the transport never gives those
    back); a permit the dead worker held frees when its lease runs out."""
    total, lease = 30, 4.0
    cluster = start_cluster(clusters, postgres_url, lease=lease)
    children = {w.name: set(w.children()) for w in cluster.workers}
    watcher = Watcher(postgres_url, cluster).start()
    hold = cluster.app_module.hold
    results = [hold.delay(0.4, i) for i in range(total)]

    def idle_after_a_parked_task(worker: Any) -> bool:
        runs = [e for e in cluster.events() if e["pid"] in children[worker.name]]
        begun = {e["id"] for e in runs if e["event"] == "start"}
        done = {e["id"] for e in runs if e["event"] == "end"}
        return begun == done and bool(done & watcher.ever_parked)

    found: list[Any] = []

    def a_worker_idle_after_a_parked_task() -> bool:
        found[:] = [w for w in cluster.workers if idle_after_a_parked_task(w)][:1]
        return bool(found)

    cluster.wait_for(a_worker_idle_after_a_parked_task, 30, "a worker idle after a parked task")
    (victim,) = found
    (survivor,) = (w for w in cluster.workers if w is not victim)
    victim_children = children[victim.name]
    for pid in victim_children:
        os.kill(pid, signal.SIGSTOP)  # the victim's own children, started by this test

    def victim_holds_a_handover() -> bool:
        begun = {e["id"] for e in starts(cluster)}
        return any(
            f"[{r.id}] received" in victim.text() and r.id not in begun
            for r in results
            if r.id in watcher.ever_parked
        )

    cluster.wait_for(victim_holds_a_handover, 20, "a handover taken by the frozen victim")
    parked_at_kill = watcher.parked_now()
    victim.kill_all()
    killed_at = time.time()

    # Begun in the victim and not finished there: its body may even have ended, its
    # result not stored (a child frozen between the two).
    stored = {r.id for r in results if r.ready()}
    cut = {
        e["id"]
        for e in starts(cluster)
        if e["pid"] in victim_children
        and not (
            e["id"] in stored
            and any(x["id"] == e["id"] and x["event"] == "end" for x in cluster.events())
        )
    }
    started_by_victim = {e["id"] for e in starts(cluster) if e["pid"] in victim_children}
    received_by_victim = {r.id for r in results if f"[{r.id}] received" in victim.text()}
    never_parked = {r.id for r in results} - watcher.ever_parked - parked_at_kill
    may_be_lost = cut | (received_by_victim & never_parked)
    must_run = {r.id for r in results} - may_be_lost

    def all_ran() -> bool:
        ended = {e["id"] for e in cluster.events() if e["event"] == "end"}
        return must_run <= ended

    try:
        cluster.wait_for(all_ran, 45, "every task that must run ran")
    finally:
        watcher.stop()
    events = cluster.events()
    ends = [e["id"] for e in events if e["event"] == "end"]
    figures = {
        "parked at the kill": len(parked_at_kill),
        "ever parked": len(watcher.ever_parked),
        "cut by the kill": len(cut),
        "received by the victim, never parked": len(received_by_victim & never_parked),
        # taken from the broker by the victim after a handover, not begun there: the
        # handover deadline published them again
        "rescued": len(
            {i for i in received_by_victim - never_parked if i not in started_by_victim} & set(ends)
        ),
        "ran": len(set(ends)),
        "lost": sorted(
            ("cut" if i in cut else "taken, never parked" if i in may_be_lost else "MUST RUN")
            for i in {r.id for r in results} - set(ends)
        ),
        "last end after the kill (s)": round(max(e["at"] for e in events) - killed_at, 1),
    }
    print("figures:", figures)

    assert len(parked_at_kill) >= total // 3, f"too few parked when the worker died: {figures}"
    assert parked_at_kill <= must_run, figures
    assert len(cut) <= LIMIT, figures
    assert figures["rescued"] >= 1, figures
    assert sorted(ends) == sorted(set(ends)), "a task ended twice"
    for task_id in set(ends) - cut:
        runs = [e for e in events if e["id"] == task_id and e["event"] == "start"]
        assert len(runs) == 1, f"{task_id} ran {len(runs)} times: {runs}"
    assert max_overlap([e for e in events if e["id"] not in cut]) <= LIMIT
    for tag, result in enumerate(results):
        if result.id in must_run:
            runs = [
                (e["event"], e["pid"] in victim_children) for e in events if e["id"] == result.id
            ]
            try:
                value = result.get(timeout=10)
            except ResultTimeout as error:
                raise AssertionError(
                    f"task {tag}: no result; runs (event, in the victim): {runs}; {figures}"
                ) from error
            assert value == tag
    assert "on semaphore hold is lost" not in survivor.text()
