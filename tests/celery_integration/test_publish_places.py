"""Places in line taken at publish: when the process has several apps (Celery shares
tasks between apps, so more than one may know the published task's name), when the
publish fails, and a backlog published into a full line (handover mode: parked at
publish, one script call each)."""

from __future__ import annotations

import itertools
import json
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Connection
from outcomes import script_calls

import celery_semaphore
import celery_semaphore.publish
from celery_semaphore import Semaphore
from celery_semaphore.formats import ParkedMessage, decode_payload
from celery_semaphore.state import installed_apps


@pytest.fixture
def apps(redis_url: str) -> Iterator[list[Celery]]:
    made: list[Celery] = []
    yield made
    for app in made:
        installed_apps.discard(app)
        celery_semaphore.reset(app)
        app.close()


def make(apps: list[Celery], redis_url: str, **conf: Any) -> Celery:
    app = Celery(f"places{len(apps)}", broker="memory://", set_as_current=False)
    app.conf.update(semaphore_redis_url=redis_url, **conf)
    celery_semaphore.install(app)
    app.finalize()
    apps.append(app)
    return app


def test_the_app_whose_settings_give_gates_takes_the_place(
    apps: list[Celery], redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = make(apps, redis_url)  # knows the task too, but caps no queue
    capping = make(apps, redis_url, semaphore_queue_limits={"reports": 1})
    for app in (other, capping):

        @app.task(name="proj.report", shared=False)
        def report() -> None: ...

    # The registry is a set: make the order the worst one, the other app first.
    monkeypatch.setattr(celery_semaphore.publish, "installed_apps", [other, capping])
    sent = capping.tasks["proj.report"].apply_async(queue="reports")
    sem = Semaphore(redis_url, "queue:reports", 1)
    assert [w.holder for w in sem.status().waiters] == [sent.id]
    sem.close()


def test_a_publish_that_fails_gives_its_places_back(apps: list[Celery], redis_url: str) -> None:
    """The broker is down: apply_async raises, and the task, never sent, is neither
    in line nor counted as sent (it would show in `status` for an hour)."""
    from celery_semaphore import LimitedTask
    from devkit.redis_servers import free_port

    down = Celery("down", broker=f"redis://127.0.0.1:{free_port()}/0", set_as_current=False)
    down.conf.update(
        semaphore_redis_url=redis_url, task_publish_retry=False, broker_connection_timeout=1
    )
    apps.append(down)
    up = make(apps, redis_url)
    for app in (down, up):

        @app.task(base=LimitedTask, semaphore="unsent", limit=1, shared=False, name="proj.call")
        def call() -> None: ...

    sem = Semaphore(redis_url, "unsent", 1)
    sem.attempt("holder")  # a line forms: the next ones take places
    with pytest.raises(Exception, match=r"(?i)connect|refused"):
        down.tasks["proj.call"].apply_async()
    status = sem.status()
    assert (status.waiter_count, status.sent_count) == (0, 0)
    sent = up.tasks["proj.call"].apply_async()  # a publish that works keeps its place
    status = sem.status()
    assert [w.holder for w in status.waiters] == [sent.id]
    assert status.sent_count == 1
    sem.close()


def test_the_first_publish_warns_of_tasks_that_disagree_on_a_limit(
    apps: list[Celery], redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from celery_semaphore import LimitedTask

    app = make(apps, redis_url)

    @app.task(base=LimitedTask, semaphore="partner-api", limit=5, name="p.orders")
    def orders() -> None: ...

    @app.task(base=LimitedTask, semaphore="partner-api", limit=3, name="p.invoices")
    def invoices() -> None: ...

    @app.task(base=LimitedTask, semaphore="reports", limit=2, name="p.report")
    def report() -> None: ...

    with caplog.at_level("WARNING", logger="celery_semaphore.gates"):
        orders.apply_async()
        orders.apply_async()
    warnings = [r.getMessage() for r in caplog.records if "different limits" in r.getMessage()]
    assert warnings == [
        "celery-semaphore: tasks p.invoices (limit 3) and p.orders (limit 5) share the "
        "semaphore 'partner-api' with different limits. Each task is admitted, in its turn, "
        "only while fewer than its own limit hold it, so which limit applies depends on the "
        "task that asks; `celery semaphore status` shows the limit of the last task that "
        "asked, and an operator's `celery semaphore set-limit partner-api N` applies to all "
        "of them. Give them one limit, or semaphores of their own"
    ]


def test_a_backlog_published_into_a_full_line_parks_in_publish_order_one_call_each(
    apps: list[Celery], redis_url: str
) -> None:
    """Limit 2, both permits held, 40 tasks published in a loop: each takes its place in
    publish order (tickets strictly increasing); the first two (their turn is near) are
    sent to the broker, counted as sent, with their ticket; the others are parked with
    theirs, not counted as sent; about one script call per task (the first one parked
    takes two: the publisher does not know yet that the line parks)."""
    from celery_semaphore import LimitedTask

    app = Celery("backlog", broker=redis_url, set_as_current=False)
    app.conf.update(semaphore_redis_url=redis_url, task_default_queue="backlog")
    apps.append(app)

    @app.task(base=LimitedTask, semaphore="backlog", limit=2, shared=False, name="proj.job")
    def job(index: int) -> None: ...

    sem = Semaphore(redis_url, "backlog", 2)
    for holder in ("h1", "h2"):
        assert not isinstance(sem.attempt(holder), celery_semaphore.Place)
    client = redis.Redis.from_url(redis_url)
    client.config_resetstat()
    ids = [job.delay(i).id for i in range(40)]
    calls, failed = script_calls(client)
    runs = calls - failed  # failed: NOSCRIPT at first use
    assert runs <= 40 + 2, runs  # + the first parked one's second call, + the parked index

    status = sem.status()
    tickets = {w.holder: w.ticket for w in status.waiters}
    assert [w.holder for w in sorted(status.waiters, key=lambda w: w.position)] == ids
    in_order = [tickets[task_id] for task_id in ids]
    assert all(a < b for a, b in itertools.pairwise(in_order)), "tickets follow publish order"
    assert (status.sent_count, status.parked_count) == (2, 38)
    states = {w.holder: w.state for w in status.waiters}
    assert [states[task_id] for task_id in ids] == ["asking"] * 2 + ["parked"] * 38

    for raw in client.lrange("backlog", 0, -1):  # the two sent to the broker
        headers = json.loads(raw)["headers"]
        assert headers["celery_semaphore"]["tickets"] == {"backlog": tickets[headers["id"]]}
        assert headers["celery_semaphore"]["first_ask"] is None
    assert client.llen("backlog") == 2
    for task_id, payload in client.hgetall(sem.keys.parked).items():
        message = decode_payload(app, payload.decode().split("|", 3)[3])
        assert isinstance(message, ParkedMessage)
        state = message.options["headers"]["celery_semaphore"]
        assert state["tickets"] == {"backlog": tickets[task_id.decode()]}
        assert state["first_ask"] is not None  # its wait budget runs from the publish
        assert message.queue == "backlog"
    client.close()
    sem.close()


def test_a_backlog_publish_whose_semaphores_redis_dies_sends_the_message_to_the_broker(
    apps: list[Celery], redis_url: str
) -> None:
    """The one-call path (take a place and park) against a semaphores' Redis that stops
    between two publishes: the publish that cannot reach it sends its message to the
    broker without a ticket (nothing lost: the broker keeps it, and the task takes its
    place at its first attempt in a worker), and nothing is left half done."""
    from celery_semaphore import LimitedTask
    from devkit.redis_servers import RedisServer

    with RedisServer() as semaphores:
        app = Celery("dies", broker=redis_url, set_as_current=False)
        app.conf.update(
            semaphore_redis_url=semaphores.url,
            task_default_queue="dies",
        )
        apps.append(app)

        @app.task(base=LimitedTask, semaphore="dies", limit=1, shared=False, name="proj.dies")
        def job(index: int) -> None: ...

        sem = Semaphore(semaphores.url, "dies", 1)
        assert not isinstance(sem.attempt("holder"), celery_semaphore.Place)
        ids = [job.delay(i).id for i in range(5)]  # the first near, then the line parks
        assert sem.status().parked_count == 4
        sem.close()
        broker = redis.Redis.from_url(redis_url)
        assert broker.llen("dies") == 1
        semaphores.stop()
        late = job.delay(5).id
        sent = {
            h["id"]: h for h in (json.loads(raw)["headers"] for raw in broker.lrange("dies", 0, -1))
        }
        assert set(sent) == {ids[0], late}, "the message is in the broker"
        assert "celery_semaphore" not in sent[late], "without the ticket it could not take"
        broker.close()


def limited_job(apps: list[Celery], redis_url: str, name: str, limit: int) -> Any:
    """A LimitedTask of semaphore ``name`` and ``limit``, on a queue of that name
    in the Redis broker ``redis_url``."""
    from celery_semaphore import LimitedTask

    app = Celery(name, broker=redis_url, set_as_current=False)
    app.conf.update(semaphore_redis_url=redis_url, task_default_queue=name)
    apps.append(app)

    @app.task(base=LimitedTask, semaphore=name, limit=limit, shared=False, name=f"proj.{name}")
    def job(index: int) -> None: ...

    return job


def queued_tickets(client: redis.Redis, queue: str) -> dict[str, int]:
    """The ticket each message in ``queue`` carries, by task id."""
    tickets = {}
    for raw in client.lrange(queue, 0, -1):
        headers = json.loads(raw)["headers"]
        tickets[headers["id"]] = headers["celery_semaphore"]["tickets"][queue]
    return tickets


def test_a_line_with_room_to_spare_takes_few_places_and_keeps_publish_order(
    apps: list[Celery], redis_url: str
) -> None:
    """Limit 1,000, nobody holding: the first publish takes a place and sees the room,
    the next ones go without one (a quarter of the free permits, for 0.25 s), each
    carrying its publish time on the server's clock as its ticket: strictly increasing,
    after the first place's ticket."""
    job = limited_job(apps, redis_url, "roomy", 1000)
    client = redis.Redis.from_url(redis_url)
    client.config_resetstat()
    ids = [job.delay(i).id for i in range(100)]
    calls, failed = script_calls(client)
    assert calls - failed <= 10, f"{calls - failed} script calls for 100 publishes"
    sem = Semaphore(redis_url, "roomy", 1000)
    status = sem.status()
    assert 1 <= status.waiter_count <= 10, "the places taken to look at the line"
    placed = {w.holder: w.ticket for w in status.waiters}
    messages = queued_tickets(client, "roomy")
    tickets = [messages[task_id] for task_id in ids]
    assert all(a < b for a, b in itertools.pairwise(tickets)), "publish order"
    assert tickets[0] == placed[ids[0]]
    assert all(placed[i] == messages[i] for i in placed), "a placed task carries its place"
    client.close()
    sem.close()


def test_a_task_sent_without_a_place_stands_in_line_by_its_publish_time(
    apps: list[Celery], redis_url: str
) -> None:
    """Limit 10, nobody holding: A takes a place and sees room for two more, B and C
    go without. Then A and nine others take the permits, and D takes a place. When
    they ask (D first, then C, then B), the line is B, C, D: the order they were
    published in."""
    job = limited_job(apps, redis_url, "late", 10)
    client = redis.Redis.from_url(redis_url)
    client.config_resetstat()
    first = [job.delay(0).id]
    calls = script_calls(client)
    first += [job.delay(i).id for i in (1, 2)]
    assert script_calls(client) == calls, "B and C take no place"
    tickets = queued_tickets(client, "late")
    sem = Semaphore(redis_url, "late", 10)
    assert not isinstance(sem.attempt(first[0], tickets[first[0]]), celery_semaphore.Place)
    for i in range(9):
        assert not isinstance(sem.attempt(f"holder{i}"), celery_semaphore.Place)
    last = job.delay(3).id
    tickets = queued_tickets(client, "late")
    ids = [*first[1:], last]
    for task_id in reversed(ids):
        place = sem.attempt(task_id, tickets[task_id])
        assert isinstance(place, celery_semaphore.Place), "the cap is full"
    line = [w.holder for w in sorted(sem.status().waiters, key=lambda w: w.position)]
    assert line == ids, "B, C and D in publish order, though D asked first"
    client.close()
    sem.close()


def test_a_look_at_a_roomy_line_whose_redis_is_down_sends_the_message_and_pauses(
    apps: list[Celery], redis_url: str
) -> None:
    """The counts cannot be read (the semaphores' Redis stopped): the message goes to the
    broker without a ticket, and publishing takes no places (and looks no more) for a
    few seconds, as after any failed place at publish."""
    from celery_semaphore.state import state_of
    from devkit.redis_servers import RedisServer

    with RedisServer() as semaphores:
        job = limited_job(apps, redis_url, "looks", 100)
        job.app.conf.semaphore_redis_url = semaphores.url
        job.delay(0)  # the line's first place: its keys exist, and the room is seen
        state_of(job.app).room_at_publish._rooms.clear()  # the look is due again
        semaphores.stop()
        late = job.delay(1).id
    broker = redis.Redis.from_url(redis_url)
    headers = [json.loads(raw)["headers"] for raw in broker.lrange("looks", 0, -1)]
    sent = {h["id"]: h for h in headers}
    assert "celery_semaphore" not in sent[late], "no ticket: it takes its place in a worker"
    assert state_of(job.app).publish_paused_until > time.monotonic(), "publishing paused"
    broker.close()


AMQP = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.fixture
def rabbitmq_queue() -> Iterator[str]:
    """A queue name of this test's own on the machine's RabbitMQ, deleted at the end."""
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=2).close()
    except OSError:
        pytest.skip("no RabbitMQ on 127.0.0.1:5672")
    queue = f"celery-semaphore-test-{uuid.uuid4().hex}"
    yield queue
    with Connection(AMQP) as connection:
        connection.default_channel.queue_delete(queue)


def test_a_publisher_on_rabbitmq_without_semaphore_redis_url_refuses_to_publish(
    apps: list[Celery], redis_url: str, rabbitmq_queue: str
) -> None:
    """It used to take its places in line in redis://localhost:6379/0 (whatever Redis
    listened there) and send the task; now its first publish of a limited task
    raises the worker's message and sends nothing. With the setting, it publishes."""
    from celery_semaphore import LimitedTask
    from celery_semaphore.config import check_shared_redis

    unset = Celery("unset", broker=AMQP, set_as_current=False)
    shared = Celery("shared", broker=AMQP, set_as_current=False)
    shared.conf.semaphore_redis_url = redis_url
    for app in (unset, shared):
        apps.append(app)
        celery_semaphore.install(app)
        app.finalize()

        @app.task(base=LimitedTask, semaphore="amqp-publisher", limit=1, shared=False, name="j")
        def job() -> None: ...

    with pytest.raises(ValueError) as refused:
        unset.tasks["j"].apply_async(queue=rabbitmq_queue)
    with pytest.raises(ValueError) as worker:
        check_shared_redis(unset)
    assert str(refused.value) == str(worker.value)
    assert "semaphore_redis_url is not set and the broker (amqp://)" in str(refused.value)

    sent = shared.tasks["j"].apply_async(queue=rabbitmq_queue)
    with Connection(AMQP) as connection:
        declared = connection.default_channel.queue_declare(rabbitmq_queue, passive=True)
    assert declared.message_count == 1  # the refused one was never sent
    sem = Semaphore(redis_url, "amqp-publisher", 1)
    try:
        assert [w.holder for w in sem.status().waiters] == [sent.id]  # its place, taken here
    finally:
        sem.close()
