"""Waiting in the broker: a waiting task's message waits in a parking queue of the broker.

Real workers on the machine's RabbitMQ (a private vhost per test) and on a Redis
broker of the test's own, the semaphores in another Redis of the test's own (not
the broker's, no AOF: before parking queues, tasks there waited as countdown
retries). What an observer sees: every
task runs once, never more than the limit at once, messages wait in the parking
queue while the line is long, and nothing is lost when the process moving a
message fails, when a parked task is revoked, or when the semaphores' Redis
restarts empty.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery_harness import max_overlap
from cluster_tools import Clusters, rabbitmqctl
from kombu import Connection, Producer
from test_handover import PARKING, block, wait_parked

from celery_semaphore import Permit, Semaphore, SemaphoreTimeout, parking_queues
from celery_semaphore.formats import Gate, parking_queue
from celery_semaphore.parked_tasks import Publisher
from celery_semaphore.parking_queues import BrokerLink, parking_queue_entity
from devkit.redis_servers import RedisServer

pytestmark = pytest.mark.slow

AMQP = "amqp://guest:guest@127.0.0.1:5672"
REFUSED = "could not declare parking queue"


@pytest.fixture(params=["rabbitmq", "redis"])
def broker(request: pytest.FixtureRequest) -> Iterator[str]:
    """The broker's URL: the machine's RabbitMQ (a private vhost), or a Redis of the
    test's own, apart from the semaphores' Redis (its parking queues are lists)."""
    if request.param == "rabbitmq":
        yield f"{AMQP}/{request.getfixturevalue('rabbitmq_vhost')}"
        return
    with RedisServer() as server:
        yield server.url


@pytest.fixture
def clusters(celery_cluster: Any) -> Iterator[Clusters]:
    with Clusters(celery_cluster) as made:
        yield made


def parked_messages(broker_url: str, queue: str, semaphore: str = "hold") -> int:
    """Messages in the parking queues of ``queue`` and ``semaphore``: those parked at
    publish and those that reached a worker first (the ``.asked`` queue)."""
    total = 0
    with Connection(broker_url) as connection:
        for asked in (False, True):
            name = parking_queue(queue, Gate(semaphore, 1), asked=asked)
            with connection.channel() as channel:
                entity = parking_queue_entity(name).bind(channel)
                with contextlib.suppress(Exception):  # not declared yet
                    total += int(entity.queue_declare(passive=True).message_count)
    return total


def starts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((e for e in events if e["event"] == "start"), key=lambda e: e["at"])


def kendall_tau(order: list[int]) -> float:
    pairs = concordant = 0
    for i in range(len(order)):
        for j in range(i + 1, len(order)):
            pairs += 1
            concordant += 1 if order[i] < order[j] else -1
    return concordant / pairs if pairs else 1.0


def a_backlog_parks_and_runs_in_order(
    cluster: Any, broker: str, queue: str, timeout: float
) -> None:
    """40 tasks under limit 2 to ``queue``: more than 10 wait in its parking queues, each
    runs once, never more than 2 at once, roughly in order; nothing is left waiting."""
    hold = cluster.app_module.hold
    results = [hold.apply_async((0.15, i), queue=queue) for i in range(40)]
    cluster.wait_for(lambda: parked_messages(broker, queue) > 10, 20, "messages parked")
    assert [r.get(timeout=timeout) for r in results] == list(range(40))
    events = cluster.events()
    started = starts(events)
    assert len(started) == 40  # each ran once
    assert max_overlap(events) == 2
    assert kendall_tau([e["tag"] for e in started]) >= 0.9
    assert parked_messages(broker, queue) == 0
    status = cluster.semaphore("hold", 2).status()
    assert (status.holder_count, status.waiter_count) == (0, 0)


def test_a_backlog_waits_in_a_parking_queue_and_runs_in_order(
    clusters: Clusters, broker: str
) -> None:
    suffix = uuid.uuid4().hex[:8]
    queue = f"pq-{suffix}"
    cluster = clusters(limit=2, broker_url=broker)
    for name in ("p1", "p2"):
        cluster.worker(f"{name}-{suffix}", concurrency=2, queues=queue)
    a_backlog_parks_and_runs_in_order(cluster, broker, queue, timeout=120)


def test_a_parked_task_revoked_never_runs(clusters: Clusters, broker: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    queue = f"pr-{suffix}"
    cluster = clusters(limit=1, broker_url=broker)
    cluster.worker(f"r1-{suffix}", concurrency=2, queues=queue)
    tasks = cluster.app_module
    first = tasks.hold_until_opened.apply_async(("first",), queue=queue)
    cluster.wait_for(lambda: cluster.started(first.id), 20, "the first task started")
    waiting = [tasks.hold.apply_async((0.05, i), queue=queue) for i in range(6)]
    cluster.wait_for(lambda: parked_messages(broker, queue) >= 4, 20, "messages parked")
    revoked = waiting[3]
    revoked.revoke()
    time.sleep(1.0)  # the worker hears of the revoke
    cluster.redis.set("open:first", 1)
    assert first.get(timeout=30) == "first"
    for i, result in enumerate(waiting):
        if result is not revoked:
            assert result.get(timeout=60) == i
    time.sleep(1.0)
    ran = {e["id"] for e in cluster.events() if e["event"] == "start"}
    assert revoked.id not in ran
    assert len(ran) == 6
    assert parked_messages(broker, queue) == 0


def wait_broker_parked(cluster: Any, broker: str, queue: str, least: int) -> None:
    cluster.wait_for(
        lambda: parked_messages(broker, queue) >= least, 20, f"{least} messages parked"
    )


def behind_a_blocker(clusters: Clusters, broker: str, semaphores: RedisServer) -> Any:
    """A cluster (limit 1) whose semaphores live in ``semaphores``, a Redis of the test's
    own, and the test holding the one permit there (a restart of that Redis frees it)."""
    conf = {**PARKING, "semaphore_redis_url": semaphores.url}
    cluster = clusters(limit=1, broker_url=broker, extra_conf=conf)
    blocker = Semaphore(semaphores.url, "hold", 1).attempt("test-blocker")
    assert isinstance(blocker, Permit)
    return cluster


def test_a_line_lost_while_no_worker_ran_is_rebuilt_when_a_worker_starts(
    clusters: Clusters, broker: str
) -> None:
    suffix = uuid.uuid4().hex[:8]
    queue = f"ps-{suffix}"
    with RedisServer() as semaphores:
        cluster = behind_a_blocker(clusters, broker, semaphores)
        results = [cluster.app_module.hold.apply_async((0.05, i), queue=queue) for i in range(8)]
        wait_broker_parked(cluster, broker, queue, 6)
        semaphores.restart()  # empty: the places and the blocker are gone
        started = time.monotonic()
        cluster.worker(f"s1-{suffix}", concurrency=2, queues=queue)
        assert sorted(r.get(timeout=30) for r in results) == list(range(8))
        print(f"all ran {time.monotonic() - started:.1f} s after the worker started")
    events = cluster.events()
    assert len(starts(events)) == 8  # each once
    assert max_overlap(events) == 1
    assert parked_messages(broker, queue) == 0


def publish_placeless(cluster: Any, broker: str, queue: str, tag: int) -> Any:
    """A ``hold`` task's message put in ``queue``'s parking queue with no place in line
    (through kombu alone: the plugin takes no place), as a publish that reached the
    broker after a rebuild read the queue leaves it; its result."""
    app = cluster.app_module.app
    task_id = str(uuid.uuid4())
    message = app.amqp.as_task_v2(task_id, cluster.app_module.hold.name, args=(0.05, tag))
    parking = parking_queue(queue, Gate("hold", 1))
    with Connection(broker) as connection:
        Producer(connection.channel()).publish(
            message.body, exchange="", routing_key=parking, headers=message.headers,
            declare=[parking_queue_entity(parking)], serializer="json",
            **message.properties,
        )  # fmt: skip
    return app.AsyncResult(task_id)


def test_a_message_that_reaches_its_parking_queue_after_a_loss_was_read_gets_a_place(
    clusters: Clusters, broker: str
) -> None:
    """A place made just before the semaphores' Redis loses its data, and its message
    published to its parking queue just after the worker that noticed the loss read that
    queue: the message has no place, and no handover would ever move it. The worker
    reads the parking queues once more 2 s later (`REBUILD_AGAIN_AFTER`). Here a worker
    gives 4 parked tasks their places again after a loss; then a fifth task's message
    reaches the queue with no place; it runs too."""
    suffix = uuid.uuid4().hex[:8]
    queue = f"pr-{suffix}"
    with RedisServer() as semaphores:
        cluster = behind_a_blocker(clusters, broker, semaphores)
        worker = cluster.worker(f"r1-{suffix}", concurrency=2, queues=queue)
        results = [cluster.app_module.hold.apply_async((0.05, i), queue=queue) for i in range(4)]
        wait_broker_parked(cluster, broker, queue, 4)
        semaphores.restart()  # empty: the places and the blocker are gone
        cluster.wait_for(
            lambda: "parked in the broker their places in line again" in worker.text(),
            20, "the worker's rebuild after the loss",
        )  # fmt: skip
        results.append(publish_placeless(cluster, broker, queue, 4))
        assert sorted(r.get(timeout=30) for r in results) == list(range(5))
    events = cluster.events()
    assert len(starts(events)) == 5  # each once
    assert max_overlap(events) == 1
    assert parked_messages(broker, queue) == 0
    assert worker.text().count("parked in the broker their places in line again") == 2


def five_parked_behind_a_mover(cluster: Any, broker: str, queue: str) -> tuple[Any, Any, list[Any]]:
    """This process as a mover (its handovers move parked messages) holding the one
    permit, and five tasks parked behind it, each message in its parking queue: the
    mover, its permit, the results."""
    app = cluster.app_module.app
    publisher = Publisher(app, BrokerLink(app))
    mover = Semaphore(
        cluster.state_url, "hold", 1, on_handover=publisher, handover_window=0.0,
        handover_deadline=PARKING["semaphore_handover_deadline"],
    )  # fmt: skip
    publisher.semaphore = mover
    blocker = mover.attempt("test-blocker")
    assert isinstance(blocker, Permit)
    results = [cluster.app_module.hold.apply_async((0.05, i), queue=queue) for i in range(5)]
    wait_parked(cluster, cluster.semaphore("hold", 1), [r.id for r in results])
    wait_broker_parked(cluster, broker, queue, 5)
    return mover, blocker, results


def test_the_mover_failing_between_taking_and_publishing_loses_nothing(
    clusters: Clusters, broker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    suffix = uuid.uuid4().hex[:8]
    queue = f"pm-{suffix}"
    cluster = clusters(limit=1, broker_url=broker, extra_conf=PARKING)
    cluster.worker(f"m1-{suffix}", concurrency=2, queues=queue)
    mover, blocker, results = five_parked_behind_a_mover(cluster, broker, queue)

    taken: list[str] = []

    def dies(app: Any, channel: Any, message: Any, *args: Any, **kwargs: Any) -> None:
        taken.append(message.headers["id"])
        raise ConnectionError("the mover died before publishing")

    monkeypatch.setattr(parking_queues, "publish_moved", dies)
    released = time.monotonic()
    assert blocker.release()  # hands the head over: this process takes it, then fails
    assert taken, "the handover took a message"
    assert sorted(r.get(timeout=30) for r in results) == list(range(5))
    took = time.monotonic() - released
    events = cluster.events()
    assert len(starts(events)) == 5  # none lost, none twice
    assert max_overlap(events) == 1
    assert took < PARKING["semaphore_handover_deadline"] + 15, took
    mover.close()


def test_a_parked_tasks_wait_budget_runs_out_in_the_broker(clusters: Clusters, broker: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    queue = f"pb-{suffix}"
    conf = {**PARKING, "semaphore_max_wait_time": 2.0}
    cluster = clusters(limit=1, broker_url=broker, extra_conf=conf)
    cluster.worker(f"b1-{suffix}", concurrency=2, queues=queue)
    blocker = block(cluster)
    results = [cluster.app_module.hold.apply_async((0.05, i), queue=queue) for i in range(5)]
    wait_broker_parked(cluster, broker, queue, 3)
    for result in results:
        with pytest.raises(SemaphoreTimeout):
            result.get(timeout=30)
    assert blocker.release()
    assert starts(cluster.events()) == []
    assert parked_messages(broker, queue) == 0


@pytest.fixture
def no_parking_vhost() -> Iterator[str]:
    """A vhost where guest may not declare parking queues."""
    vhost = f"cs-noparking-{uuid.uuid4().hex[:8]}"
    if not (
        rabbitmqctl("add_vhost", vhost)
        and rabbitmqctl(
            "set_permissions", "-p", vhost, "guest", "^(?!.*semaphore-parked).*$", ".*", ".*"
        )
    ):
        rabbitmqctl("delete_vhost", vhost)
        pytest.skip("rabbitmqctl cannot make a vhost here")
    yield vhost
    rabbitmqctl("delete_vhost", vhost)


def test_a_parking_queue_the_broker_refuses_is_named_once_and_tasks_wait_the_old_way(
    clusters: Clusters, no_parking_vhost: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue, broker = "refused", f"{AMQP}/{no_parking_vhost}"
    cluster = clusters(limit=1, broker_url=broker, extra_conf=PARKING)
    worker = cluster.worker(f"n1-{uuid.uuid4().hex[:8]}", concurrency=2, queues=queue)
    blocker = block(cluster)
    results = [cluster.app_module.hold.apply_async((0.05, i), queue=queue) for i in range(6)]
    time.sleep(2.0)
    assert blocker.release()
    assert sorted(r.get(timeout=60) for r in results) == list(range(6))
    said = [
        r.getMessage()
        for r in caplog.records
        if "could not declare parking queue" in r.getMessage()
    ]
    assert len(said) == 1, said  # the publisher's, once
    assert "'refused.semaphore-parked.hold'" in said[0]
    assert "grant this broker user configure, write and read permissions" in said[0]
    assert "'refused.semaphore-parked.*'" in said[0]
    assert worker.text().count(REFUSED) <= 2  # once per process


class MoverDied(BaseException):
    """The mover's death between taking a message and publishing it: nothing of the
    process runs after it (no give-back, no reset; not an ``Exception``)."""


def test_a_message_whose_mover_died_on_a_redis_broker_is_put_back_and_runs(
    clusters: Clusters, monkeypatch: pytest.MonkeyPatch
) -> None:
    suffix = uuid.uuid4().hex[:8]
    queue = f"pk-{suffix}"
    with RedisServer() as broker_server:
        broker = broker_server.url
        cluster = clusters(limit=1, broker_url=broker, extra_conf=PARKING)
        cluster.env["CS_STUCK_AFTER"] = "2"
        cluster.worker(f"k1-{suffix}", concurrency=2, queues=queue)
        _, blocker, results = five_parked_behind_a_mover(cluster, broker, queue)

        def dies(*args: Any, **kwargs: Any) -> None:
            raise MoverDied

        monkeypatch.setattr(parking_queues, "publish_moved", dies)
        released = time.monotonic()
        with pytest.raises(MoverDied):
            blocker.release()  # hands the head over: this process takes it, and dies
        assert parked_messages(broker, queue) == 4  # the fifth in the mover's own list
        assert sorted(r.get(timeout=60) for r in results) == list(range(5))
        took = time.monotonic() - released
        events = cluster.events()
        assert len(starts(events)) == 5  # none lost, none twice
        assert max_overlap(events) == 1
        assert took < 2 + 15, took  # put back after 2 s by the worker's heartbeat
        assert "put back 1 parked message(s)" in cluster.workers[0].text()
        print(f"all ran {took:.1f} s after the mover died")


def test_a_moved_message_lost_on_its_way_to_a_worker_is_moved_again_from_its_copy(
    clusters: Clusters, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu's Redis transport pops a message from its queue and records it as
    unacknowledged in two steps: a worker SIGKILLed between them loses it (kombu's gap,
    docs/guarantees.md). A message moved out of its parking queue is its task's only
    copy, and its place in line waits for it, handed over: lost so, its task would
    never run, and under a limit of 1 nothing behind it would either, until its place
    lapsed (a week). Here the first move's publish is confirmed and the message lost
    on its way (this process moves it, and the copy never reaches the queue); the
    move kept a copy, which the next handover (after the deadline, 1.5 s) moves again:
    all five run, once each, one at a time."""
    suffix = uuid.uuid4().hex[:8]
    queue = f"pl-{suffix}"
    with RedisServer() as broker_server:
        broker = broker_server.url
        cluster = clusters(limit=1, broker_url=broker, extra_conf=PARKING)
        cluster.worker(f"l1-{suffix}", concurrency=2, queues=queue)
        _, blocker, results = five_parked_behind_a_mover(cluster, broker, queue)
        lost: list[str] = []
        publish_moved = parking_queues.publish_moved

        def lost_on_its_way(*args: Any, **kwargs: Any) -> None:
            if not lost:
                lost.append(args[2].headers["id"])
                return
            publish_moved(*args, **kwargs)

        monkeypatch.setattr(parking_queues, "publish_moved", lost_on_its_way)
        released = time.monotonic()
        assert blocker.release()  # hands the head over: this process moves it, and it is lost
        assert lost == [results[0].id]
        copies = redis.Redis.from_url(broker)
        assert copies.hkeys("celery_semaphore.parking-moved") == [lost[0].encode()]
        try:
            assert sorted(r.get(timeout=30) for r in results) == list(range(5))
        except Exception as error:
            line = [(w.holder, w.state) for w in cluster.semaphore("hold", 1).status().waiters]
            raise AssertionError(f"{error!r}; line {line}") from error
        took = time.monotonic() - released
        events = cluster.events()
        assert len(starts(events)) == 5  # none lost, none twice
        assert max_overlap(events) == 1
        assert took < PARKING["semaphore_handover_deadline"] + 15, took
        status = cluster.semaphore("hold", 1).status()
        assert (status.holder_count, status.waiter_count) == (0, 0)
        assert "moved" in cluster.workers[0].text() and "again from the copy kept" in (
            cluster.workers[0].text()
        )
        kept = copies.hlen("celery_semaphore.parking-moved")
        assert kept == 0, "each task's start forgot the copy kept of its message"
        print(f"all ran {took:.1f} s after the first copy was lost")
