"""What the PostgreSQL store leaves in its tables: rows go with the permits and places
they record, and a semaphore idle past its idle_ttl is dropped (a name used once, by a
key function, does not stay for ever)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from celery_semaphore import Semaphore


@pytest.fixture
def database(postgres_session_server: Any) -> Iterator[str]:
    name = f"cs_{uuid.uuid4().hex[:12]}"
    postgres_session_server.create_database(name)
    yield postgres_session_server.url_for(name)
    postgres_session_server.drop_database(name)


def rows(url: str, table: str) -> int:
    with psycopg.connect(url) as connection:
        row = connection.execute(f"SELECT count(*) FROM celery_semaphore.{table}").fetchone()
    assert row is not None
    return int(row[0])


def test_a_release_and_a_served_place_leave_no_rows(database: str) -> None:
    sem = Semaphore(database, "rows", 1)
    first = sem.acquire()
    place = sem.attempt("second")
    assert place.ticket
    assert (rows(database, "holders"), rows(database, "waiters")) == (1, 1)
    first.release()
    sem.attempt("second").release()
    assert (rows(database, "holders"), rows(database, "waiters")) == (0, 0)
    sem.close()


def test_a_semaphore_idle_past_its_ttl_is_dropped_by_a_new_ones_first_call(
    database: str,
) -> None:
    short = dict(lease_timeout=0.1, waiter_lease=0.1, idle_ttl=0.2)
    once = Semaphore(database, "used-once", 2, **short)
    once.acquire().release()
    kept = Semaphore(database, "kept", 2)
    kept.acquire()
    assert rows(database, "semaphores") == 2
    time.sleep(0.5)
    new = Semaphore(database, "new", 1)
    new.acquire()
    with psycopg.connect(database) as connection:
        names = sorted(
            name for (name,) in connection.execute("SELECT name FROM celery_semaphore.semaphores")
        )
    assert names == ["kept", "new"], "the idle one went; the one in use stayed"
    assert rows(database, "holders") == 2
    for sem in (once, kept, new):
        sem.close()


def test_parked_records_go_with_their_places_and_tombstones_after_an_hour(
    database: str,
) -> None:
    """A served waiter leaves a tombstone (``d``) that tells a late copy it is stale;
    it is forgotten an hour later (at the first dispatch past its due time), and a
    parked waiter whose place lapses leaves no record."""
    told: list[Any] = []
    sem = Semaphore(database, "parked-rows", 1, waiter_lease=0.2, on_handover=told.extend)
    permit = sem.acquire()
    sem.park("arrives", "payload")
    sem.park("lapses", "payload", park_lease=0.2)
    assert rows(database, "parked") == 2
    permit.release()
    handover = next(h for h in told if h.holder == "arrives")
    sem.attempt("arrives", handover=handover.token).release()
    time.sleep(0.3)
    sem.dispatch()
    with psycopg.connect(database) as connection:
        kept = connection.execute("SELECT holder, state FROM celery_semaphore.parked").fetchall()
        assert kept == [("arrives", "d")], "the lapsed place's record went; the tombstone stays"
        connection.execute("UPDATE celery_semaphore.parked SET due_ms = due_ms - 3600000")
    sem.dispatch()
    assert rows(database, "parked") == 0
    sem.close()
