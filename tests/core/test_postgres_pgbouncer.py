"""The PostgreSQL store behind PgBouncer (devkit/pgbouncer.py, the machine's package:
1.18 on Debian 12, which keeps no prepared statement in transaction mode): what the
store finds at connect, and what works in each pool mode.

- Directly: no pooler found; psycopg prepares its statements as usual.
- Session pooling: a pooler found (prepared statements off); calls work, and a release
  wakes a waiter in place by NOTIFY, on a listener of its own.
- Transaction pooling: a pooler found (prepared statements off, without which the
  calls fail); calls work; a waiter in place opens no listener (no NOTIFY could reach
  it) and asks again every ``recheck_interval``, said once in a WARNING.
- Statement pooling: calls work once the functions are installed; installing them (a
  transaction) is refused at once, naming the fix.

Each test has a database of its own on the session's cluster, reached through one
PgBouncer per pool mode for the module, so every URL (and its WARNING) is new.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import psycopg
import pytest

from celery_semaphore import AsyncSemaphore, Semaphore, SemaphoreConnectionError
from celery_semaphore.core.postgres.connection import behind_pooler, connect, server_pid
from devkit.pgbouncer import PgBouncer, PgBouncerNotFoundError, pgbouncer_version
from devkit.postgres_servers import PostgresServer
from devkit.processes import wait_until

try:
    PGBOUNCER_VERSION = pgbouncer_version()
except PgBouncerNotFoundError as missing:
    pytest.skip(f"{missing} (scripts/test.sh installs it)", allow_module_level=True)

RECHECK = 5.0  # a waiter that listens re-checks this seldom: only a NOTIFY wakes it sooner
WAKE_BOUND = 1.0  # seconds from release to grant that only a notification meets
POLL = 0.5  # a polling waiter's recheck_interval
POLL_BOUND = POLL + 1.5  # seconds from release to grant that polling meets, far below the timeout
WAIT = 15.0  # the waiters' timeout: their last ask would find the permit too, but this late
ROUNDS = 10  # calls of each statement per connection: psycopg prepares at the fifth
POLLING_LOGGER = "celery_semaphore.core.postgres.connection"


@pytest.fixture(scope="module")
def pools(postgres_session_server: PostgresServer) -> Iterator[dict[str, PgBouncer]]:
    """One PgBouncer per pool mode in front of the session's cluster."""
    with ExitStack() as stack:
        yield {
            mode: stack.enter_context(PgBouncer(postgres_session_server, mode))
            for mode in ("session", "transaction", "statement")
        }


@pytest.fixture
def database(postgres_session_server: PostgresServer) -> Iterator[str]:
    """A fresh database's name, dropped at teardown (PgBouncer's server connections to
    it cut off)."""
    name = f"cs_{uuid.uuid4().hex[:12]}"
    postgres_session_server.create_database(name)
    yield name
    postgres_session_server.drop_database(name)


def fresh_name() -> str:
    return f"pgb-{uuid.uuid4().hex}"


def take_turns(url: str) -> None:
    """Two stores (each its own connection) take one permit in turns: acquire, status
    and release `ROUNDS` times each, every call on whichever server connection the
    pool hands out."""
    name = fresh_name()
    semaphores = [Semaphore(url, name, 1) for _ in range(2)]
    try:
        for _ in range(ROUNDS):
            for sem in semaphores:
                permit = sem.acquire(timeout=5)
                assert sem.status().holder_count == 1
                assert permit.release()
        assert semaphores[0].status().holder_count == 0
    finally:
        for sem in semaphores:
            sem.close()


def release_to_waiter(pool: PgBouncer, database: str, recheck: float) -> tuple[float, int]:
    """A waiter in place, then a release: how long after the release the waiter had the
    permit, and how many client connections the pool had while it waited (the holder's
    store and the waiter's store, and the waiter's listener if it listens)."""
    url, name = pool.url_for(database), fresh_name()
    holding = Semaphore(url, name, 1, recheck_interval=recheck)
    waiting = Semaphore(url, name, 1, recheck_interval=recheck)
    outcome: dict[str, Any] = {}

    def wait() -> None:
        try:
            outcome["permit"] = waiting.acquire(timeout=WAIT, holder="waiter")
            outcome["at"] = time.monotonic()
        except BaseException as error:  # reported by the main thread
            outcome["error"] = error

    try:
        permit = holding.acquire(timeout=5)
        thread = threading.Thread(target=wait)
        thread.start()
        try:
            wait_until(
                lambda: [w.state for w in holding.status().waiters] == ["waiting in place"],
                5,
                "the waiter to wait in place",
            )
            time.sleep(0.2)  # past its last ask (and its listener's probe): asleep
            clients = pool.clients(database)
            released_at = time.monotonic()
            assert permit.release()
        finally:
            thread.join(WAIT + 5)
        assert "error" not in outcome, outcome.get("error")
        assert outcome["permit"].release()
        assert holding.status().holder_count == 0
        return outcome["at"] - released_at, clients
    finally:
        holding.close()
        waiting.close()


def polling_said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == POLLING_LOGGER and record.levelno == logging.WARNING
    ]


# ------------------------------------------------------------------- at connect


def test_a_direct_connection_is_not_taken_for_a_pooler(
    postgres_session_server: PostgresServer, database: str
) -> None:
    connection = connect(postgres_session_server.url_for(database))
    try:
        assert connection.info.backend_pid == server_pid(connection)
        assert not behind_pooler(connection)
        assert connection.prepare_threshold == 5, "psycopg's default, untouched"
    finally:
        connection.close()


@pytest.mark.parametrize("mode", ["session", "transaction"])
def test_pgbouncer_is_found_at_connect_and_gets_no_prepared_statement(
    pools: dict[str, PgBouncer], database: str, mode: str
) -> None:
    connection = connect(pools[mode].url_for(database))
    try:
        assert connection.info.backend_pid != server_pid(connection), "a made-up key"
        assert behind_pooler(connection)
        assert connection.prepare_threshold is None
    finally:
        connection.close()


@pytest.mark.skipif(
    PGBOUNCER_VERSION >= (1, 21), reason="PgBouncer 1.21+ can keep prepared statements"
)
def test_psycopg_prepared_statements_fail_through_transaction_pooling(
    pools: dict[str, PgBouncer], database: str
) -> None:
    """Why the store turns them off: with psycopg's default, two clients taking turns
    fail once they prepare (both name theirs ``_pg3_0``, on the servers they share)."""
    url = pools["transaction"].url_for(database)
    clients = [psycopg.connect(url, autocommit=True) for _ in range(2)]

    def take_turns_as_psycopg_does() -> None:
        for turn in range(ROUNDS):
            for client in clients:
                client.execute("SELECT %s::int", (turn,))

    try:
        with pytest.raises(
            (psycopg.errors.DuplicatePreparedStatement, psycopg.errors.InvalidSqlStatementName)
        ):
            take_turns_as_psycopg_does()
    finally:
        for client in clients:
            client.close()


# -------------------------------------------------------------- session pooling


def test_session_pooling_takes_every_call_and_wakes_a_waiter_by_notify(
    pools: dict[str, PgBouncer], database: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=POLLING_LOGGER)
    take_turns(pools["session"].url_for(database))
    delay, clients = release_to_waiter(pools["session"], database, RECHECK)
    assert clients == 3, "two stores' connections and the waiter's listener"
    assert delay < WAKE_BOUND, f"the waiter got the permit {delay:.2f}s after the release"
    assert polling_said(caplog) == []


# ---------------------------------------------------------- transaction pooling


def test_transaction_pooling_takes_every_call(pools: dict[str, PgBouncer], database: str) -> None:
    """What fails with prepared statements (above) works: each call one statement."""
    take_turns(pools["transaction"].url_for(database))


def test_transaction_pooling_waiters_poll_without_a_listener_and_say_so_once(
    pools: dict[str, PgBouncer], database: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=POLLING_LOGGER)
    pool = pools["transaction"]
    for _ in range(2):
        delay, clients = release_to_waiter(pool, database, POLL)
        assert clients == 2, "two stores' connections, no listener"
        assert delay < POLL_BOUND, f"the waiter got the permit {delay:.2f}s after the release"
    (said,) = polling_said(caplog)
    assert pool.url_for(database) in said
    assert "transaction" in said and "recheck_interval" in said
    assert "point semaphore_url at PostgreSQL directly or at PgBouncer in session mode" in said


def test_transaction_pooling_asyncio_waiters_poll_too(
    pools: dict[str, PgBouncer], database: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=POLLING_LOGGER)
    url, name = pools["transaction"].url_for(database), fresh_name()

    async def scenario() -> float:
        holding = AsyncSemaphore(url, name, 1, recheck_interval=POLL)
        waiting = AsyncSemaphore(url, name, 1, recheck_interval=POLL)
        try:
            permit = await holding.acquire(timeout=5)
            waiter = asyncio.create_task(waiting.acquire(timeout=WAIT, holder="waiter"))

            async def waits_in_place() -> None:
                while [w.state for w in (await holding.status()).waiters] != ["waiting in place"]:
                    await asyncio.sleep(0.02)

            await asyncio.wait_for(waits_in_place(), 5)
            released_at = time.monotonic()
            assert await permit.release()
            got = await asyncio.wait_for(waiter, WAIT + 5)
            delay = time.monotonic() - released_at
            assert await got.release()
            return delay
        finally:
            await holding.aclose()
            await waiting.aclose()

    delay = asyncio.run(scenario())
    assert delay < POLL_BOUND, f"the waiter got the permit {delay:.2f}s after the release"
    assert len(polling_said(caplog)) == 1


# ------------------------------------------------------------ statement pooling


def test_statement_pooling_refuses_to_install_at_once_and_takes_calls_after(
    postgres_session_server: PostgresServer, pools: dict[str, PgBouncer], database: str
) -> None:
    url = pools["statement"].url_for(database)
    sem = Semaphore(url, fresh_name(), 1)
    try:
        started = time.monotonic()
        with pytest.raises(SemaphoreConnectionError) as refused:
            sem.acquire(timeout=5)
        assert time.monotonic() - started < 1, "refused at once, not asked again"
        assert "semaphore migrate --sql" in str(refused.value)
    finally:
        sem.close()
    direct = Semaphore(postgres_session_server.url_for(database), fresh_name(), 1)
    try:
        direct.acquire(timeout=5).release()  # installs the functions
    finally:
        direct.close()
    take_turns(url)
