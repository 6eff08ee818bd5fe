"""Waiting in the broker, under failures: the broker restarts, a worker dies, chaos.

Real workers, real RabbitMQ, the semaphores in the test's own Redis (not the
broker). A waiting task's message waits in a parking queue of the broker
(celery_semaphore/parking_queues.py); what an observer sees must hold through a
restart of RabbitMQ (a node of the test's own), a worker SIGKILLed while it holds
the permit, a moved message that a busy worker starts late, and a bounded chaos
run: every task runs, none twice, never more than the limit at once.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery_harness import detach_client, forget_result_subscriptions, max_overlap
from cluster_tools import Clusters
from test_chaos import APPS, LEASE, LIMIT, Execution, Observer, crowded
from test_chaos import max_overlap as executions_overlap
from test_handover import PARKING, block
from test_parking_in_broker import AMQP, parked_messages, starts

from celery_semaphore import Semaphore
from devkit.processes import Processes, wait_until, worker_command
from devkit.rabbitmq_servers import RabbitMQNode, RabbitMQStartError
from devkit.redis_servers import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.chaos]


@pytest.fixture
def rabbitmq_node() -> Iterator[RabbitMQNode]:
    """A RabbitMQ node of this test's own (4-12 s to boot), stopped by pid."""
    node = RabbitMQNode()
    try:
        node.start()
    except RabbitMQStartError as error:
        node.close()
        pytest.skip(f"no RabbitMQ node of the test's own: {error}")
    yield node
    node.close()


@pytest.fixture
def clusters(celery_cluster: Any) -> Iterator[Clusters]:
    with Clusters(celery_cluster) as made:
        yield made


def wait_all_parked(cluster: Any, broker_url: str, queue: str, count: int) -> None:
    cluster.wait_for(
        lambda: parked_messages(broker_url, queue) >= count, 20, f"{count} messages parked"
    )


def stuck(cluster: Any, broker_url: str, queue: str, error: Exception) -> str:
    """What a test that timed out waiting for its tasks says: the line, the parking
    queues, the workers' logs."""
    line = [(w.holder, w.state) for w in cluster.semaphore("hold").status().waiters]
    logs = "\n".join(f"--- {w.name}\n{w.text()[-6000:]}" for w in cluster.workers)
    return f"{error!r}; line {line}; parked {parked_messages(broker_url, queue)}\n{logs}"


def ran_once_each(events: list[dict[str, Any]], ids: list[str]) -> None:
    started = [e["id"] for e in starts(events)]
    assert sorted(started) == sorted(ids), "each task starts once"


def test_parked_messages_survive_a_restart_of_rabbitmq_and_all_run_once(
    rabbitmq_node: RabbitMQNode, clusters: Clusters
) -> None:
    """Limit 2, both permits held by the test: 10 tasks park in the broker. The node
    stops and starts again (same data: the parking queue is durable, its messages
    persistent) while the workers are connected; then the permits free and every task
    runs once, never more than 2 at once.

    Costs 15-25 s: the node boots twice (4-12 s each on a 2-CPU machine), and
    Celery's consumers reconnect on kombu's schedule (2, 4, 6, 8 s apart), so the
    first handovers are moved while no consumer is back: the moved messages must
    still run when the consumers are."""
    queue, broker = "restarted", rabbitmq_node.url
    cluster = clusters(limit=2, broker_url=broker, extra_conf=PARKING)
    for name in ("a", "b"):
        cluster.worker(f"{name}-{uuid.uuid4().hex[:8]}", concurrency=2, queues=queue)
    blockers = [block(cluster, limit=2, number=n) for n in range(2)]
    hold = cluster.app_module.hold
    results = [hold.apply_async((0.2, i), queue=queue) for i in range(10)]
    wait_all_parked(cluster, broker, queue, 10)

    rabbitmq_node.restart()
    assert parked_messages(broker, queue) == 10, "the parked messages survive the restart"
    released = time.monotonic()
    for blocker in blockers:
        assert blocker.release()
    try:
        assert sorted(r.get(timeout=30) for r in results) == list(range(10))
    except Exception as error:
        raise AssertionError(stuck(cluster, broker, queue, error)) from error
    print(f"all ran {time.monotonic() - released:.1f} s after the permits freed")
    events = cluster.events()
    ran_once_each(events, [r.id for r in results])
    assert max_overlap(events) <= 2
    assert parked_messages(broker, queue) == 0
    status = cluster.semaphore("hold", 2).status()
    assert (status.holder_count, status.waiter_count) == (0, 0)


def test_a_worker_killed_holding_the_permit_leaves_the_tasks_parked_in_the_broker_to_another(
    clusters: Clusters, rabbitmq_vhost: str
) -> None:
    """Limit 1, a 2 s lease: a task of worker k1 holds the permit, six more wait in the
    broker. k1 dies whole (SIGKILL to its main process and children): nobody releases,
    the lease runs out, and worker k2 runs the six, once each, one at a time. (k1
    consumes another queue than the six's: on RabbitMQ a busy worker still takes a
    message into its buffer, which its death would give back rather than park.)"""
    suffix = uuid.uuid4().hex[:8]
    queue, broker, lease = f"pk-{suffix}", f"{AMQP}/{rabbitmq_vhost}", 2.0
    cluster = clusters(limit=1, lease=lease, broker_url=broker, extra_conf=PARKING)
    victim = cluster.worker(f"k1-{suffix}", concurrency=1, queues=f"{queue}-long")
    cluster.worker(f"k2-{suffix}", concurrency=2, queues=queue)
    hold = cluster.app_module.hold
    long = hold.apply_async((60, "long"), queue=f"{queue}-long")
    cluster.wait_for(lambda: cluster.started(long.id), 20, "the long task started")
    waiting = [hold.apply_async((0.1, i), queue=queue) for i in range(6)]
    wait_all_parked(cluster, broker, queue, 6)

    victim.kill_all()
    killed_at = time.time()
    try:
        assert [r.get(timeout=30) for r in waiting] == list(range(6))
    except Exception as error:
        raise AssertionError(stuck(cluster, broker, queue, error)) from error
    took = time.time() - killed_at
    print(f"the parked tasks ran {took:.1f} s after the kill (lease {lease} s)")
    events = cluster.events()
    others = [e for e in events if e["id"] != long.id]
    ran_once_each(others, [r.id for r in waiting])
    assert min(e["at"] for e in starts(others)) > killed_at, "one ran beside the long one"
    assert max_overlap(others) == 1
    assert [e["event"] for e in events if e["id"] == long.id] == ["start"]
    assert long.state != "SUCCESS"
    assert took < lease + 10, "the lease, not something slower, freed the permit"
    assert parked_messages(broker, queue) == 0
    status = cluster.semaphore("hold", 1).status()
    assert (status.holder_count, status.waiter_count) == (0, 0)


def test_a_task_moved_out_of_its_parking_queue_runs_even_if_its_worker_starts_it_late(
    clusters: Clusters, rabbitmq_vhost: str
) -> None:
    """Limit 1, a 1.5 s handover deadline, one worker whose only pool process is busy
    for 6 s with a task of no semaphore. Three tasks park in the broker; the permit
    frees: the head's message is moved to the handover queue and reaches the busy
    worker, which starts it only when its pool process is free, several deadlines
    later (the deadline hands the turn over again meanwhile). The moved message is
    the task's only copy: every task still runs, once each, one at a time."""
    suffix = uuid.uuid4().hex[:8]
    queue, broker = f"pl-{suffix}", f"{AMQP}/{rabbitmq_vhost}"
    cluster = clusters(limit=1, broker_url=broker, extra_conf=PARKING)
    cluster.worker(f"l1-{suffix}", concurrency=1, queues=queue)
    blocker = block(cluster)
    tasks = cluster.app_module
    results = [tasks.hold.apply_async((0.05, i), queue=queue) for i in range(3)]
    wait_all_parked(cluster, broker, queue, 3)
    busy = tasks.plain.apply_async((6.0, "busy"), queue=queue)
    cluster.wait_for(lambda: cluster.started(busy.id), 20, "the busy task started")
    assert blocker.release()
    try:
        assert [r.get(timeout=30) for r in results] == list(range(3))
    except Exception as error:
        raise AssertionError(stuck(cluster, broker, queue, error)) from error
    events = [e for e in cluster.events() if e["id"] != busy.id]
    ran_once_each(events, [r.id for r in results])
    assert max_overlap(events) == 1
    assert parked_messages(broker, queue) == 0


# ---- chaos on RabbitMQ, the semaphores in a Redis of their own that loses its data ----

CHAOS_SECONDS, SETTLE_SECONDS = 20.0, 25.0
WORKERS, CONCURRENCY = 2, 3
DATA_LOSSES, BETWEEN_LOSSES = 2, 7.0
REBUILT = re.compile(r"gave (\d+) task\(s\) parked in the broker their places")


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_chaos_with_the_semaphores_in_a_redis_that_loses_its_data(
    broker: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """test_chaos.py's run, bounded (20 s of chaos, about 40 s in all), on RabbitMQ
    and on a Redis broker (not the semaphores' Redis): waiting tasks park in the
    broker; the semaphores' Redis (no persistence) is
    restarted empty twice and stalled, pool children and whole workers are SIGKILLed,
    a worker shuts down warm, tasks are revoked. The bodies' own records say: never
    more than the limit at once, no task body runs twice (chaos_app's task acks
    early: no redelivery after its start), no task lost but an execution a SIGKILL cut
    (acknowledged when it began), no revoked task started after its revoke."""
    seed = int(os.environ.get("CHAOS_SEED") or time.time())
    print(f"chaos seed {seed} (CHAOS_SEED={seed} repeats this run)")
    rng = random.Random(seed)
    with RedisServer() as state, RedisServer() as semaphores:
        broker_url = (
            f"{AMQP}/{request.getfixturevalue('rabbitmq_vhost')}"
            if broker == "rabbitmq"
            else state.url_for(1)
        )
        processes = Processes(tmp_path, cwd=APPS)
        try:
            run_chaos(
                rng, broker_url=broker_url, state=state, semaphores=semaphores,
                processes=processes, monkeypatch=monkeypatch, request=request,
            )  # fmt: skip
        finally:
            if semaphores.pid:
                os.kill(semaphores.pid, signal.SIGCONT)
            processes.stop_all(grace=5)


def run_chaos(
    rng: random.Random,
    *,
    broker_url: str,
    state: RedisServer,
    semaphores: RedisServer,
    processes: Processes,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
        "CS_BROKER_URL": broker_url,
        "CS_STUCK_AFTER": "5",  # a mover killed mid-move: its message back within the settle
        "CS_REDIS_URL": state.url,
        "CS_SEMAPHORE_URL": semaphores.url,
        "CS_LIMIT": str(LIMIT),
        "CS_RATE": "",
        "CS_LEASE": str(LEASE),
    }
    for key, value in env.items():
        if key.startswith("CS_"):
            monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(APPS))
    monkeypatch.delitem(sys.modules, "chaos_app", raising=False)
    import chaos_app

    app = chaos_app.app
    submitted: dict[str, Any] = {}

    def forget_results() -> None:  # before the test's Redis stops (see test_chaos.py)
        for backend in {id(r.backend): r.backend for r in submitted.values()}.values():
            forget_result_subscriptions(backend)
        submitted.clear()
        detach_client(app)

    request.addfinalizer(forget_results)
    names = iter(f"q{n}" for n in range(100))
    worker_started: dict[int, float] = {}

    def start_worker() -> Any:
        name = f"{next(names)}-{uuid.uuid4().hex[:6]}"
        child = processes.start(
            name, worker_command("chaos_app", name, concurrency=CONCURRENCY), env
        )
        worker_started[child.pid] = time.time()
        return child

    workers = [start_worker() for _ in range(WORKERS)]
    wait_until(lambda: all(" ready." in w.text() for w in workers), 60, "workers ready")
    records = redis.Redis.from_url(state.url, socket_timeout=10)
    sem = Semaphore(redis.Redis.from_url(semaphores.url, socket_timeout=10), "chaos", LIMIT)
    observer = Observer(records, sem)
    watching = threading.Thread(target=observer.run, daemon=True)
    watching.start()
    threading.Thread(target=observer.watch_processes, daemon=True).start()

    revoked: dict[str, float] = {}
    worker_deaths: dict[int, float] = {}
    shutdowns: list[float] = []
    done = dict.fromkeys(["child kill", "worker kill", "warm shutdown", "revoke", "stall",
                          "data loss"], 0)  # fmt: skip
    last_loss = time.monotonic()
    stop_producing = threading.Event()

    def produce() -> None:
        while not stop_producing.wait(rng.uniform(0.05, 0.2)):
            try:
                result = chaos_app.body.apply_async(
                    (round(rng.uniform(0.1, 0.6), 3),),
                    {"account": rng.choice("AAAB")},
                    priority=rng.choice([None, None, 0, 5]),
                )
            except Exception:  # the semaphores' Redis stalled or restarting: try later
                continue
            submitted[result.id] = result

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    began = time.monotonic()
    try:
        while time.monotonic() - began < CHAOS_SECONDS:
            time.sleep(rng.uniform(1.0, 2.0))
            action = rng.choice(
                ["child kill"] * 3 + ["revoke"] * 2 + ["worker kill", "warm shutdown", "stall"]
            )
            if done["data loss"] < DATA_LOSSES and time.monotonic() - last_loss > BETWEEN_LOSSES:
                action = "data loss"
            live = [w for w in workers if w.alive()]
            if action == "child kill":
                running = [e for e in list(observer.executions) if e.until is None]
                if running:
                    os.kill(rng.choice(running).pid, signal.SIGKILL)
                    done[action] += 1
            elif action == "revoke":
                waiting = [i for i in list(submitted) if i not in revoked]
                if waiting:
                    task_id = rng.choice(waiting[-20:])
                    revoked[task_id] = time.time()
                    app.control.revoke(task_id)
                    done[action] += 1
            elif action == "worker kill" and done[action] < 2 and live:
                victim = rng.choice(live)
                worker_deaths[victim.pid] = time.time()
                victim.kill_group()
                workers = [w for w in workers if w is not victim] + [start_worker()]
                done[action] += 1
            elif action == "warm shutdown" and done[action] < 1 and live:
                leaving = rng.choice(live)
                shutdowns.append(time.time())
                leaving.signal(signal.SIGTERM)
                leaving.finish(time.monotonic() + 20)
                workers = [w for w in workers if w is not leaving] + [start_worker()]
                done[action] += 1
            elif action == "stall" and done[action] < 2 and semaphores.pid:
                pid = semaphores.pid
                os.kill(pid, signal.SIGSTOP)
                time.sleep(rng.uniform(0.5, 2.0))
                os.kill(pid, signal.SIGCONT)
                done[action] += 1
            elif action == "data loss":
                semaphores.restart()
                last_loss = time.monotonic()
                done[action] += 1
    finally:
        stop_producing.set()
        producer.join(10)
        if semaphores.pid:
            os.kill(semaphores.pid, signal.SIGCONT)

    lost_with_worker: set[str] = set()

    def unfinished() -> list[str]:
        return observer.unfinished(submitted, revoked, worker_deaths, lost_with_worker)

    deadline = time.monotonic() + SETTLE_SECONDS
    while unfinished() and time.monotonic() < deadline:
        time.sleep(0.5)
    observer.stop()
    watching.join(10)
    observer.look()
    now = time.time()
    executions = observer.executions
    by_task: dict[str, list[Execution]] = defaultdict(list)
    for execution in executions:
        by_task[execution.task_id].append(execution)
    figures = {
        "tasks": len(submitted),
        "executions": len(executions),
        **done,
        "peak bodies": executions_overlap(executions, now),
        "lost with a killed worker": len(lost_with_worker),
    }
    logs = "\n".join(f"--- {w.name}\n{w.text()}" for w in processes)
    figures["parked at a worker"] = logs.count("retry: waiting for a permit")
    figures["places rebuilt"] = sum(map(int, REBUILT.findall(logs)))
    print("chaos figures:", json.dumps(figures))

    if figures["peak bodies"] > LIMIT:
        pytest.fail(f"more bodies than the limit: {crowded(executions, now)}\n{figures}")
    twice = {i: runs for i, runs in by_task.items() if len(runs) > 1}
    assert not twice, f"tasks whose body ran twice: {twice}\n{figures}"
    left = unfinished()
    if left:
        waiters = {w.holder: w.state for w in sem.status().waiters}
        details = [
            (i, submitted[i].state, observer.prerun.get(i), waiters.get(i), observer.handed.get(i))
            for i in left
        ]
        moments = {"worker kills": sorted(worker_deaths.values()), "warm shutdowns": shutdowns}
        pytest.fail(
            f"{len(left)} tasks never ended (id, state, preruns, place, first seen handed "
            f"over): {details}\n{moments}\n{figures}\n{logs[-8000:]}"
        )
    for task_id, when in revoked.items():
        late = [
            e
            for e in by_task.get(task_id, [])
            if e.start > when + 1.0 and worker_started.get(e.worker, now) < when
        ]
        assert late == [], f"revoked {task_id} started after its revoke: {late}"
    assert "is lost (lease ran out" not in logs
    assert done["data loss"] == DATA_LOSSES, done
    assert "lost its data" in logs
    assert figures["executions"] > 30, figures  # the run did real work
    assert figures["parked at a worker"] > 10, figures  # and lines were long
