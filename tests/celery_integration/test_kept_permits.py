"""Kept permits with real workers (``semaphore_keep_idle``): a pool process keeps its
permit between tasks while nobody waits, starts its next task on it without a script
call, and gives it back when a line forms, when idle, and however the process ends.

Real ``celery worker`` subprocesses (prefork) on the test's own redis-server; the
script calls are counted by Redis itself (``INFO commandstats``)."""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

import pytest
from celery_harness import Cluster, max_overlap, settle

from celery_semaphore.core.constants import KEPT_PREFIX
from celery_semaphore.metrics import SemaphoreCollector

pytestmark = pytest.mark.slow

KEEP = {"semaphore_keep_idle": 30.0}
#: A limit with room to spare: publishers send new tasks without a place
#: (`celery_semaphore.room_at_publish`), as with a cap that does not bind.
ROOMY = 100
#: A warm shutdown may take billiard's 30 s: a child whose last result the main process
#: did not read before its loop stopped waits that long before it exits (billiard's
#: ``Worker._ensure_messages_consumed``: py-spy showed the children waiting there, not
#: in the plugin), so the chaos test waits longer than that.
WARM_EXIT = 45.0


def kept(cluster: Cluster, name: str = "hold") -> list[str]:
    holders = cluster.semaphore(name).status().holders
    return [h.holder for h in holders if h.holder.startswith(KEPT_PREFIX)]


def scraped(cluster: Cluster, name: str = "hold") -> dict[str, float]:
    """What a metrics scrape exports of semaphore ``name``."""
    return SemaphoreCollector(cluster.redis, cluster.semaphore(name).namespace).read()[name]


def script_calls(cluster: Cluster) -> int:
    """Script and function calls Redis has run so far (every store operation is one)."""
    stats = cluster.redis.info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
        for name in ("fcall", "fcall_ro", "evalsha", "evalsha_ro", "eval")
    )


def run_one(cluster: Cluster, tag: Any, **options: Any) -> None:
    result = cluster.app_module.hold.apply_async((0.0, tag), **options)
    result.get(timeout=15)


def test_a_kept_permit_starts_the_next_tasks_with_no_script_call(celery_cluster: Any) -> None:
    cluster = celery_cluster(limit=ROOMY, extra_conf=KEEP)
    worker = cluster.worker(concurrency=1)
    run_one(cluster, "first")
    cluster.wait_for(lambda: len(kept(cluster)) == 1, 5, "the permit kept")
    (holder,) = kept(cluster)
    assert holder.startswith(f"kept|{worker.name}@"), holder
    info = cluster.semaphore().status().holders[0].info
    assert '"kept_by"' in info, info
    metrics = scraped(cluster)
    assert (metrics["holders"], metrics["kept_permits"]) == (1, 1), "kept, idle, shown apart"
    before = script_calls(cluster)
    for i in range(20):
        run_one(cluster, i)
    calls = script_calls(cluster) - before
    # the heartbeat may renew once meanwhile; publishing a task may take a place
    assert calls <= 4, f"{calls} script calls for 20 tasks on a kept permit"
    assert kept(cluster) == [holder], "the same permit, kept all along"
    assert max_overlap(cluster.events()) <= 1


def test_a_line_forming_brings_the_kept_permit_back_and_the_waiter_starts(
    celery_cluster: Any,
) -> None:
    cluster = celery_cluster(limit=1, extra_conf=KEEP)
    cluster.worker("w1", concurrency=1, queues="q1")
    cluster.worker("w2", concurrency=1, queues="q2")
    run_one(cluster, "keeper", queue="q1")
    cluster.wait_for(lambda: len(kept(cluster)) == 1, 5, "w1 keeps the permit")
    asked = time.time()
    waiter = cluster.app_module.hold.apply_async((0.0, "waiter"), queue="q2")
    waiter.get(timeout=10)
    started = next(e["at"] for e in cluster.events() if e["tag"] == "waiter")
    assert started - asked < 2.0, "the waiter did not wait for the idle time (30 s)"
    assert max_overlap(cluster.events()) <= 1


def test_an_idle_kept_permit_goes_back_after_the_idle_time(celery_cluster: Any) -> None:
    cluster = celery_cluster(limit=ROOMY, extra_conf={"semaphore_keep_idle": 0.5})
    cluster.worker(concurrency=1)
    run_one(cluster, "once")
    ended = time.monotonic()
    cluster.wait_for(lambda: cluster.holders() == 0, 5, "the idle kept permit given back")
    assert time.monotonic() - ended >= 0.3


def test_keeping_off_by_default_releases_at_the_end_of_each_task(celery_cluster: Any) -> None:
    cluster = celery_cluster(limit=ROOMY)
    cluster.worker(concurrency=1)
    run_one(cluster, "once")
    cluster.wait_for(lambda: cluster.holders() == 0, 2, "released")
    assert kept(cluster) == []


@pytest.mark.parametrize("victim", ["child", "worker-warm", "worker-cold"])
def test_every_ending_of_the_process_gives_the_kept_permit_back(
    celery_cluster: Any, victim: str
) -> None:
    cluster = celery_cluster(limit=ROOMY, extra_conf=KEEP)
    worker = cluster.worker(concurrency=1)
    run_one(cluster, "keeper")
    cluster.wait_for(lambda: len(kept(cluster)) == 1, 5, "the permit kept")
    settle(0.5)  # the main process learns its children's pids at its looks (every 0.2 s)
    ended = time.monotonic()
    if victim == "child":
        (child,) = worker.children()
        os.kill(child, signal.SIGKILL)
    else:
        worker.signal(signal.SIGTERM if victim == "worker-warm" else signal.SIGQUIT)
        worker.wait_exit()
        ended = time.monotonic()
    cluster.wait_for(lambda: kept(cluster) == [], 5, f"kept permit back after {victim}")
    assert time.monotonic() - ended < 1.0, "back within 1 s of the kill, or of the exit"


def test_a_whole_worker_killed_frees_its_kept_permit_at_the_lease_end(
    celery_cluster: Any,
) -> None:
    cluster = celery_cluster(limit=ROOMY, lease=2.0, extra_conf=KEEP)
    worker = cluster.worker(concurrency=1)
    run_one(cluster, "keeper")
    cluster.wait_for(lambda: len(kept(cluster)) == 1, 5, "the permit kept")
    long = cluster.app_module.hold.apply_async((30.0, "long"))
    cluster.wait_for(lambda: cluster.started(long.id), 10, "a task on the kept permit")
    settle(2.5)
    assert len(kept(cluster)) == 1, "renewed by the keeper past its first lease"
    worker.kill_all()
    cluster.wait_for(lambda: kept(cluster) == [], 2.0 + 1.0, "the lease ran out")


def test_a_limit_lowered_below_the_kept_permits_gets_them_back(celery_cluster: Any) -> None:
    cluster = celery_cluster(limit=2, extra_conf=KEEP)
    worker = cluster.worker(concurrency=2)
    a = cluster.app_module.hold.apply_async((0.5, "a"))
    b = cluster.app_module.hold.apply_async((0.5, "b"))
    a.get(timeout=10), b.get(timeout=10)
    cluster.wait_for(lambda: len(kept(cluster)) == 2, 5, "both children keep a permit")
    cluster.semaphore().set_limit(1)
    waiter = cluster.app_module.hold.apply_async((0.0, "after"))
    waiter.get(timeout=10)
    cluster.wait_for(lambda: cluster.holders() <= 1, 5, "back within the lowered limit")
    assert worker.children()


def test_chaos_with_kept_permits_never_breaks_the_cap_nor_leaks_a_permit(
    celery_cluster: Any,
) -> None:
    """Bounded chaos (about 25 s): short tasks on a small cap, so lines form and go and
    permits are kept and recalled all along, while children are SIGKILLed, tasks
    revoked and a worker restarted warm. Never more bodies at once than the limit,
    every task not revoked runs, and no permit is left once the workers are stopped."""
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "33")))
    cluster = celery_cluster(limit=2, lease=4.0, extra_conf={"semaphore_keep_idle": 1.0})
    workers = [cluster.worker(f"c{i}", concurrency=2) for i in range(2)]
    hold = cluster.app_module.hold
    sent, revoked = [], set()
    killed_at: dict[int, float] = {}
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        for _ in range(rng.randint(1, 4)):
            sent.append(hold.apply_async((rng.choice([0.0, 0.01, 0.05]), len(sent))))
        roll = rng.random()
        if roll < 0.08:
            children = [c for w in workers for c in w.children()]
            if children:
                child = rng.choice(children)
                os.kill(child, signal.SIGKILL)
                killed_at[child] = time.time()
        elif roll < 0.14 and sent:
            victim = rng.choice(sent[-8:])
            victim.revoke()
            revoked.add(victim.id)
        elif roll < 0.16:
            old = workers.pop(0)
            old.signal(signal.SIGTERM)
            old.wait_exit(WARM_EXIT)
            workers.append(cluster.worker(f"{old.name}r{len(sent)}", concurrency=2))
        time.sleep(rng.uniform(0.05, 0.3))

    def missing() -> set[str]:
        """Tasks not revoked that never started, but those whose child was SIGKILLed
        after it took them (acknowledged early: lost, as Celery's semantics say)."""
        waiting = {r.id for r in sent} - revoked - started_ids(cluster)
        return {r.id for r in sent if r.id in waiting and not lost_with_child(r)}

    cluster.wait_for(lambda: not missing(), 30, "every task not revoked has run")
    started = started_ids(cluster)
    assert max_overlap(with_kills(cluster.events(), killed_at)) <= 2, "never over the limit"
    assert started
    for worker in workers:
        worker.signal(signal.SIGTERM)
        worker.wait_exit(WARM_EXIT)
    cluster.wait_for(lambda: cluster.holders() == 0, 4.0 + 1.0, "no permit left")


def with_kills(events: list[dict[str, Any]], killed_at: dict[int, float]) -> list[dict[str, Any]]:
    """The bodies' records, with an end at the kill for a body whose child was killed."""
    ended = {e["id"] for e in events if e["event"] == "end"}
    cut = [
        {**e, "event": "end", "at": killed_at[e["pid"]]}
        for e in events
        if e["event"] == "start" and e["id"] not in ended and e["pid"] in killed_at
    ]
    return events + cut


def lost_with_child(result: Any) -> bool:
    return result.state == "FAILURE" and "WorkerLostError" in repr(result.result)


def started_ids(cluster: Cluster) -> set[str]:
    return {e["id"] for e in cluster.events() if e["event"] == "start"}


def test_each_thread_of_a_thread_pool_keeps_its_own_and_gives_it_back_at_shutdown(
    celery_cluster: Any,
) -> None:
    cluster = celery_cluster(limit=ROOMY, extra_conf=KEEP)
    worker = cluster.worker(pool="threads", concurrency=2)
    both = [cluster.app_module.hold.apply_async((0.3, i)) for i in range(2)]
    for result in both:
        result.get(timeout=15)
    cluster.wait_for(lambda: len(kept(cluster)) == 2, 5, "one kept permit per thread")
    assert all(f"|{worker.pid}." in holder for holder in kept(cluster)), kept(cluster)
    worker.signal(signal.SIGTERM)
    worker.wait_exit(WARM_EXIT)
    cluster.wait_for(lambda: kept(cluster) == [], 1, "given back when the worker stopped")


def test_a_task_on_a_kept_permit_revoked_with_terminate_leaks_nothing(
    celery_cluster: Any,
) -> None:
    cluster = celery_cluster(limit=ROOMY, extra_conf=KEEP)
    worker = cluster.worker(concurrency=1)
    run_one(cluster, "keeper")
    cluster.wait_for(lambda: len(kept(cluster)) == 1, 5, "the permit kept")
    (before,) = kept(cluster)
    long = cluster.app_module.hold.apply_async((30.0, "long"))
    cluster.wait_for(lambda: cluster.started(long.id), 10, "the long task on the kept permit")
    assert kept(cluster) == [before] and cluster.holders() == 1, "it started on the kept permit"
    long.revoke(terminate=True)
    cluster.wait_for(
        lambda: all(f"|{pid}|" in h for h in kept(cluster) for pid in worker.children()),
        5,
        "no permit kept for a process that is gone",
    )
    cluster.wait_for(lambda: cluster.holders() <= 1, 5, "nothing leaked")
