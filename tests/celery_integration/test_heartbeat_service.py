"""The heartbeat as a plain service, driven without a worker: a real Redis, a Celery
app on the in-memory broker, and a list of running requests the test controls."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery import Celery

import celery_semaphore
from celery_semaphore import LimitedTask, Permit, Place, Semaphore, per_key, signals
from celery_semaphore.core import losses
from celery_semaphore.core.redis import parked_index
from celery_semaphore.core.redis.keys import watch_channel
from celery_semaphore.formats import GATES_HEADER, Gate, encode_gates
from celery_semaphore.signals import permit_lost
from celery_semaphore.state import state_of
from celery_semaphore.worker.dead_children import DeadChildren, reaped_by_signal
from celery_semaphore.worker.heartbeat import Heartbeat
from devkit.redis_servers import RedisServer

LEASE = 0.6


@dataclass
class Running:
    """What the heartbeat reads of a worker Request."""

    id: str
    task: Any
    time_start: float
    hostname: str = "test@host"
    request_dict: dict[str, Any] = field(default_factory=dict)
    worker_pid: int | None = None


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


class Reports:
    """What ``permit_lost`` said, while connected."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, sender: Any = None, **fields: Any) -> None:
        self.seen.append((fields["task_id"], fields["semaphore"]))

    def __enter__(self) -> Reports:
        permit_lost.connect(self, weak=False)
        return self

    def __exit__(self, *exc: object) -> None:
        permit_lost.disconnect(self)


def lost_total(sem: Semaphore) -> int:
    return int(sem.client.hget(sem.keys.meta, "m_lost") or 0)


def test_a_lost_permit_of_a_running_body_is_reported_once(app: Celery, redis_url: str) -> None:
    """Seen holding, then gone at two beats an interval apart while still running:
    one report, one count in the metric."""
    define_task(app)
    sem = Semaphore(redis_url, "hb", 2, lease_timeout=LEASE)
    assert isinstance(sem.attempt("task-1"), Permit)
    assert isinstance(sem.attempt("task-2"), Permit)
    started = time.time()
    requests = [running(app, "task-1", started), running(app, "task-2", started)]
    now = [1000.0]
    heartbeat = Heartbeat(app, lambda: requests, interval=60, clock=lambda: now[0])
    with Reports() as reports:
        heartbeat.beat()  # both held
        sem.release("task-2")  # the permit goes (its lease ran out, say) while it runs
        heartbeat.beat()
        assert reports.seen == [], "reported at the first beat that missed it"
        now[0] += 60
        heartbeat.beat()
        heartbeat.beat()
    assert reports.seen == [("task-2", "hb")]
    assert lost_total(sem) == 1
    sem.close()


def test_requests_that_never_held_or_gave_their_permit_back_are_not_reported(
    app: Celery, redis_url: str
) -> None:
    """A request waiting for its permit (refused, in line) across many beats, and
    one whose body ended and gave its permit back: no report, no count."""
    define_task(app)
    sem = Semaphore(redis_url, "hb", 2, lease_timeout=LEASE)
    done = sem.attempt("task-done")
    assert isinstance(done, Permit)
    assert isinstance(sem.attempt("task-busy"), Permit)
    assert not isinstance(sem.attempt("task-waiting", wait_lease=60), Permit)
    started = time.time() - 60  # long past the time it may take to acquire
    requests = [running(app, name, started) for name in ("task-done", "task-busy", "task-waiting")]
    now = [1000.0]
    heartbeat = Heartbeat(app, lambda: list(requests), interval=60, clock=lambda: now[0])
    with Reports() as reports:
        heartbeat.beat()
        done.release()
        del requests[0]  # the request ends with its body
        for _ in range(4):
            now[0] += 60
            heartbeat.beat()
    assert reports.seen == []
    assert lost_total(sem) == 0
    sem.close()


def test_a_renewal_of_a_permit_that_is_gone_counts_as_lost(redis_url: str) -> None:
    """The core API: renewing a Permit whose permit went counts one loss; renewing a
    bare holder id that holds nothing counts none (it may never have held)."""
    sem = Semaphore(redis_url, "hb-core", 1, lease_timeout=LEASE)
    permit = sem.attempt("a")
    assert isinstance(permit, Permit)
    sem.release("a")
    assert sem.renew_many([permit, "never-held"]) == {"a", "never-held"}
    assert lost_total(sem) == 1
    sem.close()


@pytest.mark.parametrize(("how", "released"), [("SIGKILL", True), ("exit", False)])
def test_a_killed_child_is_seen_before_it_is_reaped(
    app: Celery, redis_url: str, how: str, released: bool
) -> None:
    """The main process (here: the test) sees its killed child as a zombie and
    releases by task id without reaping it; a child that exits normally gave its
    permits back itself and is left alone."""
    define_task(app)
    sem = Semaphore(redis_url, "hb", 2, lease_timeout=60)
    assert isinstance(sem.attempt("task-1"), Permit)
    code = "import sys, time; time.sleep(60)" if how == "SIGKILL" else "import sys; sys.exit(0)"
    child = subprocess.Popen([sys.executable, "-c", code])
    request = running(app, "task-1", time.time())
    request.worker_pid = child.pid
    watcher = DeadChildren(lambda: [request])
    try:
        if how == "SIGKILL":
            watcher.look()
            assert sem.status().holder_count == 1, "released while the child lived"
            os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            assert time.monotonic() < deadline, "the child did not end"
            time.sleep(0.01)
        watcher.look()
        assert sem.status().holder_count == (0 if released else 1)
        # not reaped: that stays the pool's (Celery's WorkerLostError path)
        assert os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    finally:
        child.kill()
        child.wait()
        sem.close()


class Job:
    """A billiard job as `reaped_by_signal` reads it (``Pool._cache`` values)."""

    def __init__(self, pid: int, exitcode: int | None) -> None:
        self.pid = pid
        self._worker_lost = None if exitcode is None else (time.monotonic(), exitcode)

    def worker_pids(self) -> list[int]:
        return [self.pid]


@pytest.mark.parametrize(("exitcode", "released"), [(-9, True), (0, False), (None, False)])
def test_a_killed_child_the_pool_reaped_first_is_released_too(
    app: Celery, redis_url: str, exitcode: int | None, released: bool
) -> None:
    """Billiard sometimes reaps the killed child before a look sees the zombie; its
    job then waits seconds for WorkerLostError. The pool's record of the child's exit
    (killed by a signal: released; exited, or not lost: left alone) closes that gap."""
    define_task(app)
    sem = Semaphore(redis_url, "hb", 2, lease_timeout=60)
    assert isinstance(sem.attempt("task-1"), Permit)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child.kill()
    child.wait()  # reaped: waitid knows nothing of it any more
    request = running(app, "task-1", time.time())
    request.worker_pid = child.pid
    pool = type("TaskPool", (), {"_pool": type("Pool", (), {"_cache": {}})()})()
    pool._pool._cache[1] = Job(child.pid, exitcode)
    try:
        assert reaped_by_signal(pool) == ({child.pid} if released else set())
        DeadChildren(lambda: [request], reaped=lambda: reaped_by_signal(pool)).look()
        assert sem.status().holder_count == (0 if released else 1)
        assert reaped_by_signal(object()) == set()  # another pool: nothing to read
    finally:
        sem.close()


def test_a_killed_child_listed_until_it_is_reaped_is_not_reported_lost(
    app: Celery, redis_url: str
) -> None:
    """The killed child's permit was released at once (dead_children); its request is
    listed until the pool reaps the child, seconds later: not a lost permit."""
    define_task(app)
    sem = Semaphore(redis_url, "hb", 2, lease_timeout=60)
    assert isinstance(sem.attempt("task-1"), Permit)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    request = running(app, "task-1", time.time() - 60)
    request.worker_pid = child.pid
    now = [1000.0]
    heartbeat = Heartbeat(app, lambda: [request], interval=60, clock=lambda: now[0])
    try:
        with Reports() as reports:
            heartbeat.beat()  # held
            os.kill(child.pid, signal.SIGKILL)
            while os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                time.sleep(0.01)
            DeadChildren(lambda: [request]).look()  # released by task id
            for _ in range(3):
                now[0] += 60
                heartbeat.beat()
        assert reports.seen == []
        assert lost_total(sem) == 0
    finally:
        child.kill()
        child.wait()
        sem.close()


def scans(client: Any) -> int:
    """How many SCAN commands this Redis served (INFO commandstats)."""
    return int(client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))


def test_parked_tasks_are_found_without_scan_once_the_heartbeat_started(
    app: Celery, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task parked by another process whose holder's lease then runs out (nobody
    calls) is handed over by the next beat, found in the parked index: the beats
    send no SCAN (the first look scans once, for tasks parked before the index).
    Once it is gone, its semaphore leaves the index."""
    from celery_semaphore.formats import encode_signature

    @app.task(name="hb.plain", shared=False)
    def plain() -> None: ...

    heartbeat = Heartbeat(app, list, interval=LEASE / 4)
    heartbeat.look_after_parked()  # the first look, before anything parked
    client = state_of(app).semaphores.store(redis_url).client
    before = scans(client)

    elsewhere = Semaphore(redis_url, "hb-parked", 1, lease_timeout=LEASE, on_handover=list)
    assert isinstance(elsewhere.attempt("holder"), Permit)
    place = elsewhere.attempt("parked")
    assert not isinstance(place, Permit)
    elsewhere.park("parked", encode_signature(app, plain.s(), 10**6), place.ticket)
    heartbeat.look_after_parked()
    assert [(w.holder, w.state) for w in elsewhere.status().waiters] == [("parked", "parked")]
    time.sleep(LEASE * 1.5)  # the holder's lease runs out; nobody calls

    heartbeat.look_after_parked()
    waiters = elsewhere.status().waiters
    assert [(w.holder, w.state) for w in waiters] == [("parked", "handed over")]
    assert scans(client) == before

    assert elsewhere.release("parked") is False  # gone (revoked, say)
    monkeypatch.setattr(parked_index, "FORGET_AFTER", 0.0)
    heartbeat.look_after_parked()
    assert parked_index.read(client, "celery_semaphore")[1] == []
    assert scans(client) == before
    elsewhere.close()


def test_a_semaphore_whose_hand_over_fails_does_not_stop_the_others(
    app: Celery, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each semaphore in the parked index is looked after on its own: one whose
    dispatch fails (here its meta key was overwritten with a string) gets a WARNING
    naming it, and the semaphores listed after it are still handed over."""
    from celery_semaphore.formats import encode_signature

    @app.task(name="hb.plain", shared=False)
    def plain() -> None: ...

    heartbeat = Heartbeat(app, list, interval=LEASE / 4)
    client = state_of(app).semaphores.store(redis_url).client
    made = [
        Semaphore(redis_url, name, 1, lease_timeout=LEASE, on_handover=list)
        for name in ("a-broken", "b-parked")  # looked after in this order
    ]
    for sem in made:
        assert isinstance(sem.attempt("holder"), Permit)
        place = sem.attempt("parked")
        assert isinstance(place, Place)
        sem.park("parked", encode_signature(app, plain.s(), 10**6), place.ticket)
    broken, parked = made
    client.delete(broken.keys.meta)
    client.set(broken.keys.meta, "not a hash")
    time.sleep(LEASE * 1.5)  # the holders' leases run out; nobody calls

    with caplog.at_level(logging.WARNING):
        heartbeat.look_after_parked()
    waiters = parked.status().waiters
    assert [(w.holder, w.state) for w in waiters] == [("parked", "handed over")]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("could not hand over parked tasks of a-broken" in m for m in warnings), warnings
    for sem in made:
        sem.close()


def test_parked_tasks_are_handed_over_with_the_settings_of_their_task(
    app: Celery, redis_url: str
) -> None:
    """A task's own ``semaphore_handover_deadline`` holds when the heartbeat hands its
    parked tasks over, as when its own release does: the copy is handed over again
    after the task's deadline (2 s), not the app's (300 s)."""
    from celery_semaphore.formats import encode_signature

    app.conf.semaphore_handover_deadline = 300.0

    @app.task(
        base=LimitedTask, semaphore="hb-own-deadline", limit=1, name="hb.own", shared=False,
        semaphore_handover_deadline=2.0,
    )  # fmt: skip
    def own() -> None: ...

    heartbeat = Heartbeat(app, list, interval=LEASE / 4)
    sem = Semaphore(redis_url, "hb-own-deadline", 1, lease_timeout=LEASE, on_handover=list)
    assert isinstance(sem.attempt("holder"), Permit)
    place = sem.attempt("parked")
    assert isinstance(place, Place)
    sem.park("parked", encode_signature(app, own.s(), 10**6), place.ticket)
    time.sleep(LEASE * 1.5)  # the holder's lease runs out; nobody calls

    heartbeat.look_after_parked()
    assert [(w.holder, w.state) for w in sem.status().waiters] == [("parked", "handed over")]
    again_at = sem.client.zscore(sem.keys.handed, "parked") / 1000
    seconds, micros = sem.client.time()
    assert 1.0 < again_at - (seconds + micros / 1e6) <= 2.0
    sem.close()


def test_a_per_key_semaphore_takes_the_settings_of_the_task_seen_running_on_it(
    app: Celery, redis_url: str
) -> None:
    """A key function's semaphore names are known only from the requests that run: a
    beat that renews one learns whose settings its parked tasks are handed over with."""
    app.conf.semaphore_handover_deadline = 300.0

    @app.task(
        base=LimitedTask, limit=1, name="hb.per_key", shared=False,
        semaphore=per_key("customers", lambda customer, **_: f"customer-{customer}"),
        semaphore_handover_deadline=2.0,
    )  # fmt: skip
    def per_customer(customer: str) -> None: ...

    gates = encode_gates([Gate("customer-7", 1, "customers")])
    task = app.tasks[per_customer.name]  # the task itself, as a worker's request has it
    request = Running("t-1", task, time.time(), request_dict={GATES_HEADER: gates})
    heartbeat = Heartbeat(app, lambda: [request], interval=60)
    assert heartbeat.parked.config_for("customer-7").handover_deadline == 300.0
    heartbeat.beat()
    assert heartbeat.parked.config_for("customer-7").handover_deadline == 2.0
    assert heartbeat.parked.config_for("customer-8").handover_deadline == 300.0


def test_a_data_loss_is_an_error_only_where_tasks_were_parked(
    app: Celery, redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The parked hash also keeps tasks waiting in place, whose messages a loss does
    not take: a loss is reported as parked tasks lost (an ERROR) only for a
    semaphore with parked ones; every loss gets its WARNING and its signal."""
    app.conf.semaphore_heartbeat_interval = 0.5  # a pause of 1 s after each loss
    define_task(app)
    parked, in_place = (
        Semaphore(redis_server.url, name, 1, on_handover=lambda handovers: None)
        for name in ("parked", "in-place")
    )
    heartbeat = Heartbeat(app, list, interval=60)
    signalled: list[dict[str, Any]] = []

    def on_data_lost(sender: Any, **fields: Any) -> None:
        signalled.append(fields)

    def block_and_wait(park: bool) -> None:
        for sem in (parked, in_place):
            assert isinstance(sem.attempt("test-blocker"), Permit)
        place = parked.attempt("a")
        assert isinstance(place, Place)
        if park:
            parked.park("a", "payload-a", place.ticket)
        assert isinstance(in_place.attempt("b", in_place=True), Place)

    def reports() -> list[tuple[int, str]]:
        records = [r for r in caplog.records if "lost its data" in r.getMessage()]
        caplog.clear()
        return [(r.levelno, r.getMessage()) for r in records]

    losses.listen(heartbeat.notice)
    signals.data_lost.connect(on_data_lost)
    try:
        block_and_wait(park=True)
        heartbeat.look_after_parked()
        redis_server.restart()
        heartbeat.look_after_parked()  # its first call notices the loss
        heartbeat.beat()  # and reports it
        (warning, error) = reports()
        assert warning[0] == logging.WARNING
        assert "no permit is granted until" in warning[1]
        assert "wrote back the permits of 0 running limited task(s)" in warning[1]
        assert error[0] == logging.ERROR
        assert "the tasks parked there are lost (semaphores parked);" in error[1]
        assert signalled[-1]["parked_lost"] == ["parked"]
        assert signalled[-1]["paused_for"] > 0

        time.sleep(signalled[-1]["resumes_at"] - time.time() + 0.1)
        block_and_wait(park=False)  # "a" only asks; "b" waits in place
        heartbeat.look_after_parked()
        redis_server.restart()
        heartbeat.look_after_parked()  # nothing parked: it makes no call, notices nothing
        assert isinstance(in_place.attempt("c"), Place)  # this call of the process notices
        heartbeat.beat()
        ((level, _),) = reports()
        assert level == logging.WARNING
        assert signalled[-1]["parked_lost"] == []
        assert len(signalled) == 2
    finally:
        signals.data_lost.disconnect(on_data_lost)
        losses.unlisten(heartbeat.notice)
        parked.close()
        in_place.close()


def test_a_message_on_the_watch_channel_makes_it_beat_at_once(app: Celery, redis_url: str) -> None:
    """What ``celery semaphore resume`` (and the other commands that may admit) rely on:
    each message on ``<namespace>:watch`` starts a beat. The interval here is far
    longer than the lease: only the beats the messages start keep the permit alive."""
    define_task(app)
    sem = Semaphore(redis_url, "hb", 2, lease_timeout=LEASE)
    assert isinstance(sem.attempt("task-1"), Permit)
    requests = [running(app, "task-1", time.time())]
    heartbeat = Heartbeat(app, lambda: requests, interval=60.0)
    heartbeat.start()
    channel = watch_channel("celery_semaphore")
    try:
        deadline = time.monotonic() + 10
        while sem.client.pubsub_numsub(channel) != [(channel.encode(), 1)]:
            assert time.monotonic() < deadline, "the watch thread did not subscribe"
            time.sleep(0.02)
        for _ in range(int(LEASE * 5 / 0.1)):
            assert sem.client.publish(channel, "hb") == 1
            time.sleep(0.1)
        assert [h.holder for h in sem.status().holders] == ["task-1"], "the lease ran out"
    finally:
        heartbeat.stop()
