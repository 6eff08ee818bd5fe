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


def test_tables_made_by_an_older_release_get_the_new_columns_when_a_newer_installs(
    database: str,
) -> None:
    """An install finds the tables there (CREATE TABLE IF NOT EXISTS leaves them as they
    are): a column added since (``counters``) comes by ALTER TABLE ... ADD COLUMN IF NOT
    EXISTS, and this release's functions write it."""
    from celery_semaphore.core.postgres.schema import FUNCTIONS, TABLES

    first = Semaphore(database, "first", 1)
    first.acquire().release()
    first.close()
    with psycopg.connect(database, autocommit=True) as connection:
        # as an older release left them: no counters column, other functions
        connection.execute(f"DROP SCHEMA {FUNCTIONS} CASCADE")
        connection.execute(f"ALTER TABLE {TABLES}.semaphores DROP COLUMN counters")
        connection.execute(f"DELETE FROM {TABLES}.versions")
    sem = Semaphore(database, "after", 2)
    sem.acquire().release()
    with psycopg.connect(database) as connection:
        row = connection.execute(
            f"SELECT counters FROM {TABLES}.semaphores WHERE name = 'after'"
        ).fetchone()
    assert row is not None and row[0]["m_granted"] == 1
    sem.close()


def test_an_observation_falls_in_the_bucket_the_model_puts_it_in(database: str) -> None:
    """The histogram's bucket of a wait or hold (``observe()``) at and around every bound
    is the model's (`Counters.observe`): the conformance suite compares only how many
    observations each histogram has, since the two sides' clocks differ by a few ms."""
    from celery_semaphore.core.constants import HISTOGRAM_BOUNDS_MS
    from celery_semaphore.core.model.counters import Counters
    from celery_semaphore.core.postgres.schema import FUNCTIONS

    sem = Semaphore(database, "installs", 1)
    sem.status()  # the functions are installed at the first call
    sem.close()
    values = sorted({0, 1, *(b + d for b in HISTOGRAM_BOUNDS_MS for d in (-1, 0, 1))})
    with psycopg.connect(database) as connection:
        for ms in values:
            row = connection.execute(
                f"SELECT {FUNCTIONS}.observe('{{}}', 'wait', %s)", (ms,)
            ).fetchone()
            assert row is not None
            expected = Counters()
            expected.observe("wait", ms)
            assert row[0] == dict(expected), ms


def test_handover_tokens_keep_increasing_when_the_clock_steps_back(database: str) -> None:
    """The last handover token is kept with the semaphore, and a new one is past it
    (max(last + 1, now)), so a copy handed over later never carries an older token even
    if the database's clock stepped back meanwhile (as here: the kept token set ahead)."""
    told: list[Any] = []
    sem = Semaphore(database, "tokens", 1, on_handover=told.extend)
    permit = sem.acquire()
    for holder in ("first", "second", "third", "fourth"):
        sem.park(holder, "payload")
    permit.release()
    assert told, "the release handed over the head of the line"
    with psycopg.connect(database, autocommit=True) as connection:
        row = connection.execute(
            "SELECT handover FROM celery_semaphore.semaphores WHERE name = 'tokens'"
        ).fetchone()
        assert row == (max(h.token for h in told),), "the last token is kept with the semaphore"
        ahead = row[0] + 3_600_000_000  # an hour of µs: the clock 'stepped back' an hour
        connection.execute(
            "UPDATE celery_semaphore.semaphores SET handover = %s WHERE name = 'tokens'", (ahead,)
        )
    before = len(told)
    first = next(h for h in told if h.holder == "first")
    sem.attempt("first", handover=first.token).release()
    later = told[before:]
    assert later, "the release handed over the next"
    assert [h.token for h in later] == list(range(ahead + 1, ahead + 1 + len(later)))
    sem.close()
