"""Every way a limited task can end gives its permit back, seen from outside.

Real ``celery worker`` subprocesses (prefork unless said otherwise) on the
test's own redis-server. The tests only watch the semaphore (holders,
waiters), the ``events`` the task bodies record and the ``signals`` list the
worker's processes record (tests/celery_apps/endings_app.py). For an ending
the worker hears of, the holder count is back to zero within 1 s of it; for a
worker killed outright, within the lease + 1 s.

Who releases, as observed here (Celery 5.7, billiard 4.3):

- success, exception, own retry, Ignore, Reject, soft time limit: the child's ``finally``;
- SIGTERM to a child (``revoke(terminate=True)``, cold shutdown): the child
  still runs ``finally``; the main process releases again by task id (idempotent);
- SIGKILL to a child (``revoke(signal="KILL")``, OOM): only the main process,
  when Celery reports it (``task_revoked`` / ``task_failure``); for a child
  killed from outside that is when the pool reaps it (at once, or at its 5 s
  maintenance timer), not at the kill;
- hard time limit: billiard sends SIGTERM, then SIGKILL 0.1 s later; the main
  process gets ``task_failure`` twice (once without the request context) and
  releases on the first that names the request;
- acks_late + reject_on_worker_lost: nobody releases; the redelivered task
  takes back its own permit (same holder id) or the lease runs out;
- the whole worker SIGKILLed: the lease runs out.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery_harness import Cluster, Worker, detach_client, max_overlap, repoint_client

pytestmark = pytest.mark.slow

APP = "endings_app"
WITHIN = 1.0  # the bound between an ending the worker hears of and the release


# -- helpers (test_heartbeat.py uses them too) --------------------------------------------------


@pytest.fixture
def endings(celery_cluster: Any) -> Iterator[Any]:
    """``endings(**cluster_kwargs) -> (cluster, endings_app)``: a cluster whose
    workers run ``endings_app`` (``app=APP``), and that module, for its tasks."""
    made: list[Cluster] = []

    def make(**kwargs: Any) -> tuple[Cluster, Any]:
        cluster = celery_cluster(**kwargs)
        import endings_app

        repoint_client(cluster)
        made.append(cluster)
        return cluster, endings_app

    yield make
    if made:  # before celery_cluster's teardown stops the server
        detach_client(made[0].app_module.app)


def starts_of(cluster: Cluster, task_id: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events() if e["id"] == task_id and e["event"] == "start"]


def start_of(cluster: Cluster, task_id: str, timeout: float = 15.0, nth: int = 1) -> dict[str, Any]:
    """The ``nth`` start record of ``task_id``, waiting for it."""
    cluster.wait_for(
        lambda: len(starts_of(cluster, task_id)) >= nth, timeout, f"start #{nth} of {task_id}"
    )
    return starts_of(cluster, task_id)[nth - 1]


def released_by(cluster: Cluster, deadline: float, what: str, name: str = "hold") -> float:
    """Wait until the holder count is 0, failing past ``deadline`` (epoch s); returns when."""
    cluster.wait_for(
        lambda: cluster.holders(name) == 0, max(deadline - time.time(), 0.05), f"release {what}"
    )
    now = time.time()
    assert now <= deadline + 0.1, f"{what}: released {now - deadline:.2f}s late"
    return now


def holder_ids(cluster: Cluster, name: str = "hold") -> list[str]:
    return [h.holder for h in cluster.semaphore(name).status().holders]


def outcome(cluster: Cluster, result: Any, timeout: float = 20.0) -> str:
    """Poll the result's state until it is ready; returns it.

    Polling (a GET) rather than ``result.get()``, which waits on the pub/sub
    consumer of the session-wide client app.
    """
    cluster.wait_for(result.ready, timeout, f"{result.id} ready")
    return str(result.state)


def value(cluster: Cluster, result: Any, timeout: float = 20.0) -> Any:
    state = outcome(cluster, result, timeout)
    assert state == "SUCCESS", f"{result.id}: {state} {result.result!r}"
    return result.result


def signals_of(cluster: Cluster, kind: str, task_id: str | None = None) -> list[dict[str, Any]]:
    """Records of the ``signals`` list (see endings_app) of one kind (and task)."""
    entries = [json.loads(e) for e in cluster.redis.lrange("signals", 0, -1)]
    return [
        e for e in entries if e["kind"] == kind and (task_id is None or e["task_id"] == task_id)
    ]


def wait_signals(
    cluster: Cluster, kind: str, task_id: str, count: int = 1, *, released: bool | None = None
) -> list[dict[str, Any]]:
    """Wait for ``count`` records (a signal handler writes its record after the
    state the test saw changed), then return them all; ``released`` filters
    ``permit_released`` records."""

    def matching() -> list[dict[str, Any]]:
        entries = signals_of(cluster, kind, task_id)
        return [e for e in entries if released is None or e["released"] is released]

    cluster.wait_for(lambda: len(matching()) >= count, 2.0, f"{count} {kind} of {task_id}")
    return matching()


def wait_logged(cluster: Cluster, worker: Worker, text: str, timeout: float) -> float:
    """Wait for ``text`` in the worker's log; returns when it was seen (epoch s)."""
    cluster.wait_for(lambda: text in worker.text(), timeout, f"log line {text!r}")
    return time.time()


@contextlib.contextmanager
def sampling(cluster: Cluster, name: str = "hold", every: float = 0.05) -> Iterator[list[Any]]:
    """Sample the semaphore's status in a thread for the duration of the block."""
    samples: list[Any] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):
                samples.append(cluster.semaphore(name).status())
            stop.wait(every)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(5)


# -- endings the child runs through (admission releases in ``finally``) -------------------------


@pytest.mark.parametrize(
    ("how", "state"),
    [
        ("ok", "SUCCESS"),
        ("fail", "FAILURE"),
        ("ignore", None),
        ("reject", "FAILURE"),
        ("retry_once", "SUCCESS"),
    ],
)
def test_child_side_endings_release_within_1s(endings, how, state):
    cluster, apps = endings(limit=1)
    cluster.worker("w1", app=APP, concurrency=1)
    result = apps.ending.delay(how, 0.4)
    first = start_of(cluster, result.id)
    assert holder_ids(cluster) == [result.id]
    if how == "retry_once":
        start_of(cluster, result.id, nth=2)
    if state is not None:
        assert outcome(cluster, result) == state
        released_by(cluster, time.time() + WITHIN, how)
    else:  # Ignore stores no result: the ending is the end of the 0.4 s body
        released_by(cluster, first["at"] + 0.4 + WITHIN, how)
    assert cluster.waiters() == 0
    runs = 2 if how == "retry_once" else 1
    released = wait_signals(cluster, "permit_released", result.id, runs)
    assert [e["released"] for e in released] == [True] * runs


def test_own_retry_gives_the_permit_back_between_runs(endings):
    cluster, apps = endings(limit=1)
    cluster.worker("w1", app=APP, concurrency=2)
    result = apps.retry_later.delay(2.5)
    first = start_of(cluster, result.id)
    released_by(cluster, first["at"] + WITHIN, "before the retry runs")
    other = apps.hold.delay(0.1, "between")  # the permit is free for others meanwhile
    assert value(cluster, other) == "between"
    assert len(starts_of(cluster, result.id)) == 1, "the retry ran too early for this check"
    assert value(cluster, result) == 1
    released_by(cluster, time.time() + WITHIN, "after the retry")


def test_soft_time_limit_releases_within_1s(endings):
    cluster, apps = endings(limit=1)
    cluster.worker("w1", app=APP, concurrency=1)
    result = apps.soft_limited.delay(5.0)
    first = start_of(cluster, result.id)
    assert holder_ids(cluster) == [result.id]
    assert outcome(cluster, result) == "FAILURE"
    assert "SoftTimeLimitExceeded" in repr(result.result)
    released_by(cluster, time.time() + WITHIN, "soft time limit")
    assert time.time() - first["at"] < 4.0  # the ending released it, not a lease


@pytest.mark.chaos
def test_hard_time_limit_releases_within_1s_and_stays_idempotent(endings):
    cluster, apps = endings(limit=1, lease=30.0)
    worker = cluster.worker("w1", app=APP, concurrency=2)
    result = apps.hard_limited.delay(10.0)
    start_of(cluster, result.id)
    assert holder_ids(cluster) == [result.id]
    follow = apps.hold.delay(1.5, "after")  # waits for the permit meanwhile
    assert outcome(cluster, result) == "FAILURE"
    assert "TimeLimitExceeded" in repr(result.result)
    released_by_at = time.time() + WITHIN
    cluster.wait_for(
        lambda: cluster.holders() == 0 or holder_ids(cluster) == [follow.id],
        WITHIN,
        "the killed task's permit released",
    )
    assert time.time() <= released_by_at + 0.1
    # the main process heard of it twice; the permit was released once
    failures = wait_signals(cluster, "task_failure", result.id, 2)
    assert len(failures) == 2, failures
    assert sorted(e["context"] for e in failures) == [False, True]  # one names no request
    assert {e["pid"] for e in failures} == {worker.pid}
    released = wait_signals(cluster, "permit_released", result.id, released=True)
    assert len(released) == 1, released
    # the duplicate report must not free the next holder's permit
    start_of(cluster, follow.id)
    time.sleep(0.3)
    assert holder_ids(cluster) == [follow.id]
    assert value(cluster, follow) == "after"
    released_by(cluster, time.time() + WITHIN, "after the follower")
    assert "Hard time limit (1.0s) exceeded" in worker.text()


# -- endings only the worker's main process hears of -------------------------------------------


REVOKE_SETUPS = {
    # reserved behind the holder in a busy worker (concurrency 1), its place taken at publish
    "prefetched": (1, {}),
    # refused, waiting in place in a child when revoked: the worker discards the
    # retry message it publishes next as soon as it arrives (before task_received)
    "waiting_in_place": (2, {"semaphore_max_block": 2.0, "semaphore_backoff_max": 0.5}),
    # refused, its retry message waiting in the main process's ETA timer when revoked
    "in_eta_timer": (
        2,
        {
            "semaphore_wait_mode": "countdown",
            "semaphore_max_block": 0.0,
            "semaphore_backoff_base": 1.0,
            "semaphore_backoff_max": 1.0,
            "semaphore_backoff_jitter": False,
        },
    ),
}


@pytest.mark.parametrize("where", sorted(REVOKE_SETUPS))
def test_revoke_before_start_takes_no_permit_and_leaves_the_line(endings, where):
    """A task revoked while it waits for a permit never takes one, and its
    place in line goes within 1 s of the worker discarding it."""
    concurrency, conf = REVOKE_SETUPS[where]
    cluster, apps = endings(limit=1, extra_conf=conf)
    worker = cluster.worker("w1", app=APP, concurrency=concurrency)
    with sampling(cluster) as samples:
        holder = apps.hold.delay(3.5, "holder")
        start_of(cluster, holder.id)
        queued = apps.hold.delay(0.1, "revoked")
        cluster.wait_for(lambda: cluster.waiters() == 1, 5.0, "the second task in line")
        if where == "in_eta_timer":
            logged = f"[{queued.id}] retry: waiting for a permit of semaphore"
            wait_logged(cluster, worker, logged, 5.0)
        cluster.app_module.app.control.revoke(queued.id)
        discarded = wait_logged(
            cluster, worker, f"Discarding revoked task: limited_app.hold[{queued.id}]", 10.0
        )
        cluster.wait_for(lambda: cluster.waiters() == 0, WITHIN, "its place dropped")
        assert time.time() <= discarded + WITHIN + 0.1
        assert value(cluster, holder) == "holder"
        released_by(cluster, time.time() + WITHIN, "after the holder")
    assert not starts_of(cluster, queued.id)
    revoked = wait_signals(cluster, "task_revoked", queued.id)
    assert [(e["pid"], e["terminated"]) for e in revoked] == [(worker.pid, False)]
    assert all(h.holder != queued.id for s in samples for h in s.holders)
    assert max(s.holder_count for s in samples) == 1
    assert cluster.waiters() == 0


@pytest.mark.chaos
@pytest.mark.parametrize("signame", ["TERM", "KILL"])
def test_revoke_terminate_while_running_releases_within_1s(endings, signame):
    cluster, apps = endings(limit=1, lease=30.0)
    worker = cluster.worker("w1", app=APP, concurrency=1)
    result = apps.hold.delay(10.0, "victim")
    start_of(cluster, result.id)
    assert holder_ids(cluster) == [result.id]
    cluster.app_module.app.control.revoke(result.id, terminate=True, signal=signame)
    assert outcome(cluster, result) == "REVOKED"
    released_by(cluster, time.time() + WITHIN, f"revoke(terminate=True, signal={signame})")
    released = wait_signals(cluster, "permit_released", result.id, released=True)
    assert len(released) == 1
    revoked = wait_signals(cluster, "task_revoked", result.id)
    assert [(e["pid"], e["terminated"]) for e in revoked] == [(worker.pid, True)]
    if signame == "KILL":  # nothing runs in the child: the main process released it
        assert released[0]["pid"] == worker.pid
    else:  # SIGTERM: the child still runs its ``finally`` (before or after the main process)
        cluster.wait_for(
            lambda: any(
                e["pid"] != worker.pid for e in signals_of(cluster, "permit_released", result.id)
            ),
            2.0,
            "the child's release",
        )


@pytest.mark.chaos
@pytest.mark.parametrize("victim", ["first", "second", "third"])
def test_killed_child_releases_within_1s_of_the_kill(endings, victim):
    """Not when the pool reaps the child (0.02-4.5 s later): the main process sees the
    killed child as a zombie (waitid WNOWAIT) and releases by task id at once. Three
    runs: with the reaping's delay spread over 0-5 s, the old path fails most."""
    cluster, apps = endings(limit=1, lease=30.0)
    worker = cluster.worker("w1", app=APP, concurrency=2)
    result = apps.hold.delay(20.0, victim)
    started = start_of(cluster, result.id)
    assert started["pid"] in worker.children()
    os.kill(started["pid"], signal.SIGKILL)
    killed_at = time.time()
    released_by(cluster, killed_at + WITHIN, "killed child")
    assert outcome(cluster, result) == "FAILURE"  # WorkerLostError, when the pool reaps the child
    assert "WorkerLostError" in repr(result.result)
    released = wait_signals(cluster, "permit_released", result.id, released=True)
    assert [e["pid"] for e in released] == [worker.pid]  # once: the reaping found it free


@pytest.mark.chaos
@pytest.mark.parametrize("order", ["any_order", "step_after_pool"])
def test_warm_shutdown_lets_tasks_finish_and_keeps_renewing(endings, order):
    """Celery boots the semaphore step before or after the Pool step (its
    topological sort is over hashed classes); after it, the step is stopped
    before the pool drains. ``step_after_pool`` forces that order."""
    cluster, apps = endings(limit=2, lease=2.0, extra_conf={"semaphore_heartbeat_interval": 0.5})
    if order == "step_after_pool":
        cluster.env["CS_STEP_AFTER_POOL"] = "1"
    worker = cluster.worker("w1", app=APP, concurrency=2, extra=["-l", "debug"])
    boot = next(line for line in worker.text().splitlines() if "New boot order" in line)
    if order == "step_after_pool":
        assert boot.index("celery-semaphore") > boot.index("Pool"), boot
    results = [apps.hold.delay(4.0, i) for i in range(2)]
    starts = [start_of(cluster, r.id) for r in results]
    worker.signal(signal.SIGTERM)
    # past the 2 s lease, while the pool drains: still held, renewed by the heartbeat
    time.sleep(max(0.0, max(s["at"] for s in starts) + 3.0 - time.time()))
    assert sorted(holder_ids(cluster)) == sorted(r.id for r in results), (
        "the heartbeat stopped renewing during the drain"
    )
    assert [value(cluster, r) for r in results] == [0, 1]
    released_by(cluster, time.time() + WITHIN, "warm shutdown")
    assert worker.wait_exit(10) == 0
    assert "Warm shutdown" in worker.text()
    assert "was lost before the task ended" not in worker.text()


@pytest.mark.chaos
@pytest.mark.parametrize("late", [False, True], ids=["acks_early", "acks_late"])
def test_cold_shutdown_releases_within_1s_of_the_exit(endings, late):
    cluster, apps = endings(limit=2, lease=30.0)
    worker = cluster.worker("w1", app=APP, concurrency=2)
    task = apps.hold_late if late else apps.hold
    results = [task.delay(4.0, i) for i in range(2)]
    for r in results:
        start_of(cluster, r.id)
    assert cluster.holders() == 2
    worker.signal(signal.SIGQUIT)
    worker.wait_exit(15)
    released_by(cluster, time.time() + WITHIN, "cold shutdown")
    assert cluster.waiters() == 0
    assert "Cold shutdown" in worker.text()
    retries = [e for e in signals_of(cluster, "task_retry") if e["pid"] == worker.pid]
    if late:  # no signal in the main process; the messages go back to the queue
        assert retries == []
        assert {r.state for r in results} == {"PENDING"}
        assert "Restoring 2 unacknowledged message(s)" in worker.text()
        cluster.worker("w2", app=APP, concurrency=2)
        assert sorted(value(cluster, r) for r in results) == [0, 1]
        released_by(cluster, time.time() + WITHIN, "redelivered tasks")
    else:  # the main process sent task_retry without einfo; the tasks are gone
        assert sorted(e["task_id"] for e in retries) == sorted(r.id for r in results)
        assert not any(e["einfo"] for e in retries)
        assert {r.state for r in results} == {"RETRY"}


@pytest.mark.chaos
def test_whole_worker_killed_lease_backstop(endings):
    lease = 3.0
    cluster, apps = endings(limit=2, lease=lease, extra_conf={"semaphore_heartbeat_interval": 0.5})
    worker = cluster.worker("w1", app=APP, concurrency=2)
    results = [apps.hold.delay(30.0, i) for i in range(2)]
    for r in results:
        start_of(cluster, r.id)
    time.sleep(1.0)
    assert cluster.holders() == 2
    worker.kill_all()
    killed_at = time.time()
    released_by(cluster, killed_at + lease + WITHIN, "whole worker SIGKILLed")
    assert time.time() - killed_at > lease - 1.0  # nobody released it: the lease ran out


@pytest.mark.chaos
def test_a_redelivered_task_after_its_child_was_killed_runs_again_within_the_cap(endings):
    """acks_late + reject_on_worker_lost: within 1 s of the kill, either the main
    process saw the killed child and released its permit (the waiting task may take
    it; the redelivery asks again with its ticket), or the pool reaped the child at
    once and the redelivery took back its own permit. Both run, never together."""
    cluster, apps = endings(limit=1, lease=30.0, extra_conf={"semaphore_backoff_max": 0.5})
    worker = cluster.worker("w1", app=APP, concurrency=2)
    with sampling(cluster) as samples:
        result = apps.hold_late.delay(2.0, "late")
        first = start_of(cluster, result.id)
        token = cluster.semaphore().status().holders[0].fencing_token
        queued = apps.hold.delay(0.2, "queued")  # waits behind it
        os.kill(first["pid"], signal.SIGKILL)
        killed_at = time.time()

        def freed_or_taken_back() -> bool:
            starts = [e for e in cluster.events() if e["id"] == result.id and e["event"] == "start"]
            return result.id not in holder_ids(cluster) or len(starts) >= 2

        cluster.wait_for(freed_or_taken_back, WITHIN + 0.2, "the killed child's permit")
        assert time.time() - killed_at <= WITHIN + 0.3
        second = start_of(cluster, result.id, nth=2, timeout=20)
        assert second["pid"] != first["pid"]
        assert second["retries"] == 0  # a redelivery, not a retry
        tokens = [h.fencing_token for h in cluster.semaphore().status().holders
                  if h.holder == result.id]  # fmt: skip
        assert tokens and tokens[0] > token  # a new permit
        assert value(cluster, result) == "late"
        assert value(cluster, queued) == "queued"
        released_by(cluster, time.time() + WITHIN, "after the redelivery")
    assert max(s.holder_count for s in samples) == 1
    assert {h.holder for s in samples for h in s.holders} == {result.id, queued.id}
    events = [e for e in cluster.events() if e["pid"] != first["pid"]]  # the killed run never ended
    assert max_overlap(events) == 1
    assert "WorkerLostError" not in repr(result.result)
    assert signals_of(cluster, "task_failure", result.id) == []  # requeued: no signal at all
    # by the redelivered run, and before it by the main process if it saw the kill first
    released = signals_of(cluster, "permit_released", result.id)
    assert [e["released"] for e in released] in ([True], [True, True])
    assert released[-1]["pid"] == second["pid"]
    assert worker.children()
