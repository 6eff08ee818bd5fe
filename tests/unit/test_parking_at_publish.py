"""Parking at publish: which publishes may park, which places are far enough back,
and a parked message published again as it was (to its handover queue)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
from celery import Celery
from kombu.serialization import loads

import celery_semaphore
from celery_semaphore import LimitedTask, Place
from celery_semaphore.core import Handover, Semaphore
from celery_semaphore.formats import ParkedMessage, decode_payload, encode_message
from celery_semaphore.parked_tasks import publish
from celery_semaphore.parking_queues import BrokerLink
from celery_semaphore.publish import TICKET_MARK, around_ticket, turn_is_near
from celery_semaphore.task import may_park


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("parking", broker="memory://", set_as_current=False)
    app.conf.semaphore_redis_url = "redis://semaphores.internal:6379/0"
    yield app
    celery_semaphore.reset(app)
    app.close()


def place(position: int, holders: int, limit: int, draining: bool = False) -> Place:
    return Place(1, position, holders, limit, draining, None)


@pytest.mark.parametrize(
    ("position", "holders", "limit", "near"),
    [
        (1, 0, 4, True),  # a free permit
        (8, 0, 4, True),  # 4 free + one more round of 4
        (9, 0, 4, False),
        (4, 4, 4, True),  # all held: the next round
        (5, 4, 4, False),
        (2, 1, 1, False),
        (1, 6, 4, True),  # over the limit (lowered): still one round
    ],
)
def test_a_turn_is_near_within_the_free_permits_plus_one_round(
    position: int, holders: int, limit: int, near: bool
) -> None:
    assert turn_is_near(place(position, holders, limit), 1.0) is near


def test_nothing_is_near_while_draining() -> None:
    assert turn_is_near(place(1, 0, 4, draining=True), 1.0) is False


def test_under_a_rate_a_turn_is_near_when_its_slot_is_within_the_window() -> None:
    free = place(1, 0, 1_000_000)
    assert turn_is_near(replace(free, rate_due=0.9), 1.0) is True
    assert turn_is_near(replace(free, rate_due=1.1), 1.0) is False, "parked at publish"


def test_only_new_tasks_sent_by_a_wrappable_producer_in_handover_mode_may_park(
    app: Celery,
) -> None:
    @app.task(base=LimitedTask, semaphore="s", limit=1, shared=False)
    def job() -> None: ...

    @app.task(base=LimitedTask, semaphore="s", limit=1, semaphore_wait_mode="countdown",
              shared=False)  # fmt: skip
    def counting() -> None: ...

    job, counting = app.tasks[job.name], app.tasks[counting.name]  # the tasks, not proxies
    assert may_park(job, {})
    assert may_park(job, {"queue": "q", "headers": {"x": 1}})
    for options in (
        {"countdown": 5},
        {"eta": "2026-01-01T00:00:00"},
        {"retries": 1},
        {"connection": object()},
        {"publisher": object()},
        {"headers": {"celery_semaphore": {"tickets": {}}}},
    ):
        assert not may_park(job, options), options
    assert not may_park(counting, {})
    app.conf.task_always_eager = True
    assert not may_park(job, {})


class Recorder:
    """A producer that records what it is asked to publish."""

    def __init__(self) -> None:
        self.published: list[tuple[Any, dict[str, Any]]] = []

    def publish(self, body: Any, **options: Any) -> None:
        self.published.append((body, options))


def test_a_parked_message_is_published_as_it_was_to_its_handover_queue(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = ([1, 2], {"k": "v"}, {"callbacks": None, "errbacks": None, "chain": None})
    sent = {
        "exchange": "", "routing_key": "work", "headers": {"id": "t-1", "x": "kept"},
        "priority": 3, "correlation_id": "t-1", "reply_to": "r", "delivery_mode": 2,
        "serializer": "json", "retry": True, "declare": [object()], "timeout": None,
    }  # fmt: skip
    payload = encode_message(app, body, sent, "work", 10_000)
    recorder = Recorder()

    @contextmanager
    def producer_or_acquire(producer: Any = None) -> Iterator[Recorder]:
        yield recorder

    monkeypatch.setattr(app, "producer_or_acquire", producer_or_acquire)
    publish(app, Semaphore("memory://", "sem", 1), Handover("t-1", 42, payload), BrokerLink(app))
    ((data, options),) = recorder.published
    assert options["routing_key"] == "work.semaphore-handover"
    assert options["exchange"] == ""
    assert [q.name for q in options["declare"]] == ["work.semaphore-handover"]
    assert options["headers"]["x"] == "kept"
    assert options["headers"]["celery_semaphore"]["handover"] == ["sem", 42]
    assert (options["priority"], options["correlation_id"], options["reply_to"]) == (3, "t-1", "r")
    assert options["content_type"] == "application/json"
    assert loads(data, options["content_type"], options["content_encoding"]) == [
        [1, 2], {"k": "v"}, {"callbacks": None, "errbacks": None, "chain": None}
    ]  # fmt: skip


def test_a_payload_in_the_broker_says_where_and_carries_the_ticket_it_is_given() -> None:
    from celery_semaphore.formats import InBroker, encode_in_broker, in_broker_around_ticket

    app = Celery("t")
    assert decode_payload(app, encode_in_broker("work.semaphore-parked.s", "work")) == InBroker(
        "work.semaphore-parked.s", "work"
    )
    head, tail = in_broker_around_ticket("work.semaphore-parked.s", "work")
    parked = decode_payload(app, head + "1234" + tail)
    assert parked == InBroker("work.semaphore-parked.s", "work")


def test_parking_queues_are_named_for_the_queue_the_semaphore_and_the_place_kind() -> None:
    from celery_semaphore.formats import Gate, parking_queue

    assert parking_queue("work", Gate("api", 2)) == "work.semaphore-parked.api"
    fair = Gate("api", 2, priority=3, fair_key="acme")
    assert parking_queue("work", fair) == "work.semaphore-parked.api.account-acme.priority3"
    long = parking_queue("work", Gate("x" * 300, 2))
    assert len(long.encode()) <= 200 and long.startswith("work.semaphore-parked.")
    assert long != parking_queue("work", Gate("x" * 299, 2))


def test_a_message_that_is_not_json_is_not_parked(app: Celery) -> None:
    with pytest.raises(TypeError):
        encode_message(app, ([], {}, {}), {"exchange": object()}, "work", 10_000)


def test_a_payload_encoded_before_its_ticket_is_known_names_it_once_spliced_in(
    app: Celery,
) -> None:
    """The one-call park at publish encodes the message with TICKET_MARK for the ticket;
    the script puts the ticket between the two halves. Arguments holding the mark are
    escaped apart (the body is encoded twice); a header holding it cannot be split so
    (None: parked the two-call way)."""
    headers = {"id": "t-1", "celery_semaphore": {"tickets": {"sem": TICKET_MARK}}}
    body = ([1], {}, {})
    halves = around_ticket(encode_message(app, body, {"headers": headers}, "work", 10_000))
    assert halves is not None
    spliced = f"{halves[0]}1795655846960283{halves[1]}"
    message = decode_payload(app, spliced)
    assert isinstance(message, ParkedMessage)
    assert message.options["headers"]["celery_semaphore"]["tickets"] == {"sem": 1795655846960283}
    assert loads(message.body, message.content_type, message.content_encoding)[0] == [1]

    in_args = ([TICKET_MARK], {}, {})
    assert around_ticket(encode_message(app, in_args, {"headers": headers}, "work", 10_000))
    in_header = {**headers, "x-mark": TICKET_MARK}
    assert around_ticket(encode_message(app, body, {"headers": in_header}, "work", 10_000)) is None
