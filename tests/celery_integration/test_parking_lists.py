"""Parking queues on a Redis broker (`celery_semaphore.parking_lists`), without workers.

A real Redis as the broker, through kombu's Redis transport, as `BrokerLink` uses
it: a move takes the head of a parking queue into its process's own list in one
atomic step, gives it back to the head, and a message a process stopped moving is
put back by the sweep; the directory is a hash of the broker's Redis.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu import Connection, Producer

from celery_semaphore import parking_lists
from celery_semaphore.formats import Gate
from celery_semaphore.parking_lists import ParkingLists
from celery_semaphore.parking_queues import BrokerLink, parking_queue_entity
from devkit.redis_servers import RedisServer

QUEUE = "home.semaphore-parked.s"


@pytest.fixture(scope="module")
def broker() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(params=["", "prefix:"])
def channel(request: pytest.FixtureRequest, broker: RedisServer) -> Iterator[Any]:
    """A kombu Redis channel on the broker (flushed), with or without
    ``global_keyprefix``."""
    options = {"global_keyprefix": request.param} if request.param else {}
    with Connection(broker.url, transport_options=options) as connection:
        channel = connection.channel()
        channel.client.flushdb()
        yield channel
        channel.close()


def publish(channel: Any, *ids: str, queue: str = QUEUE) -> None:
    for task_id in ids:
        Producer(channel).publish(
            {"task": task_id}, exchange="", routing_key=queue, headers={"id": task_id},
            declare=[parking_queue_entity(queue)],
        )  # fmt: skip


def ids_in(channel: Any, queue: str = QUEUE) -> list[str]:
    """The ids of the messages in ``queue``, the head first, as a worker would get them."""
    got = []
    while (message := channel.basic_get(queue, no_ack=True)) is not None:
        got.append(message.headers["id"])
    return got


def test_a_move_takes_the_head_and_gives_it_back_to_the_head(channel: Any) -> None:
    publish(channel, "a", "b", "c")
    lists = ParkingLists(channel, "ns", "p1")
    taken = lists.take(QUEUE)
    assert taken is not None
    assert taken.headers["id"] == "a"
    assert json.loads(taken.body) == {"task": "a"}
    taken.reject(requeue=True)
    again = lists.take(QUEUE)
    assert again is not None
    assert again.headers["id"] == "a"  # back at the head, not the tail
    again.ack()
    assert ids_in(channel) == ["b", "c"]
    assert lists.take(QUEUE) is None


def test_a_message_a_process_stopped_moving_is_put_back_at_the_head(channel: Any) -> None:
    publish(channel, "a", "b")
    dead = ParkingLists(channel, "ns", "dead")
    assert dead.take(QUEUE) is not None  # and the process dies: no ack, no give-back
    sweeper = ParkingLists(channel, "ns", "alive")
    assert sweeper.sweep() == 0  # taken a moment ago: a live move, left alone
    assert ids_in(channel) == ["b"]
    publish(channel, "b")
    assert sweeper.sweep(stuck_after=0.0) == 1
    assert ids_in(channel) == ["a", "b"]
    assert sweeper.sweep(stuck_after=0.0) == 0
    assert channel.client.hlen("ns.parking-moving") == 0  # the empty entry forgotten


def test_a_message_moved_with_a_token_is_kept_as_a_copy_until_its_task_starts(
    channel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish(channel, "a", "b")
    lists = ParkingLists(channel, "ns", "p1")
    taken = lists.take(QUEUE)
    assert taken is not None
    taken.ack_keeping_copy("a")  # published on: out of the own list, kept as a copy
    assert channel.client.llen(lists.key(lists.moving)) == 0
    copy = lists.moved_copy("a")
    assert copy is not None
    assert copy.headers["id"] == "a"
    assert json.loads(copy.body) == {"task": "a"}
    copy.reject(requeue=True)  # not moved again: nothing changes
    copy.ack()  # moved again: still kept
    assert lists.moved_copy("a") is not None
    assert lists.moved_copy("b") is None
    assert ids_in(channel) == ["b"]  # the parking queue gave it up
    assert lists.sweep() == 0
    assert lists.moved_copy("a") is not None  # kept: not old
    monkeypatch.setattr(parking_lists, "KEEP_MOVED", 0.0)
    lists.sweep()
    assert lists.moved_copy("a") is None  # kept longer than KEEP_MOVED: dropped
    assert channel.client.zcard(lists.moved_at) == 0


def test_a_started_tasks_copy_is_forgotten(channel: Any) -> None:
    publish(channel, "a")
    lists = ParkingLists(channel, "ns", "p1")
    taken = lists.take(QUEUE)
    assert taken is not None
    taken.ack_keeping_copy("a")
    lists.forget_moved("a")
    assert lists.moved_copy("a") is None
    assert channel.client.hlen(lists.moved) == channel.client.zcard(lists.moved_at) == 0


def test_the_directory_lists_each_queue_with_its_messages(channel: Any) -> None:
    lists = ParkingLists(channel, "ns", "p1")
    for queue in (QUEUE, "other.semaphore-parked.s"):
        lists.list_queue("ns.parking-queues", {"parking": queue, "home": "h", "gate": "g"})
    lists.list_queue("ns.parking-queues", {"parking": QUEUE, "home": "h", "gate": "g"})
    publish(channel, "a", "b")
    entries = {e["parking"]: e["messages"] for e in lists.directory("ns.parking-queues")}
    assert entries == {QUEUE: 2, "other.semaphore-parked.s": 0}


def test_reading_a_queue_takes_nothing_and_drops_only_what_it_is_told(channel: Any) -> None:
    publish(channel, "a", "b", "c")
    lists = ParkingLists(channel, "ns", "p1")
    seen = []
    for headers, drop in lists.messages(QUEUE):
        seen.append(headers["id"])
        if headers["id"] == "b":
            drop()
    assert seen == ["a", "b", "c"]
    assert ids_in(channel) == ["a", "c"]


def test_a_broker_redis_that_cannot_move_is_refused_once_with_what_it_needs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with RedisServer("--rename-command", "LMOVE", "") as server:
        app = Celery(broker=server.url)
        link = BrokerLink(app)
        try:
            assert not link.declare(QUEUE, "home", Gate("s", 1), "ns")
            assert not link.declare(QUEUE, "home", Gate("s", 1), "ns")  # not tried again yet
        finally:
            link.reset()
    said = [r.getMessage() for r in caplog.records if "could not declare" in r.getMessage()]
    assert len(said) == 1, said
    assert "the broker's Redis must be 6.2 or later (LMOVE)" in said[0]
    assert "wait as countdown retries" in said[0]
