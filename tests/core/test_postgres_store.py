"""The PostgreSQL store against real clusters: what it refuses and how it says so
(without the password), the URL's libpq settings, waking a waiter in place by
LISTEN/NOTIFY (sync and asyncio), processes installing the functions at once, and a
database that crashes, cuts its clients off or is shared with a forked child.

Tests on the session's cluster use a database of their own (or fresh semaphore names);
those that edit pg_hba.conf, crash the cluster or cut off its clients get a fresh one.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql

from celery_semaphore import (
    AsyncSemaphore,
    Handover,
    Permit,
    Place,
    Semaphore,
    SemaphoreBackendError,
    SemaphoreConnectionError,
    SemaphoreError,
)
from celery_semaphore.core.postgres.schema import FUNCTIONS, TABLES, sql_text
from devkit.postgres_servers import PostgresServer
from devkit.processes import wait_until
from devkit.redis_servers import free_port

# Waiters sleep at most this long between re-checks when no notification comes; the
# wake-up tests release well inside it, so only a NOTIFY can explain a fast grant.
RECHECK = 5.0
WAKE_BOUND = 1.0  # seconds from release to grant that only a notification meets
#: A password with every character a URL must percent-encode, and a wrong one.
SECRET = "s3cr3t:p@ss/w%rd?#&"
WRONG = "n0t-the-s3cr3t:p@ss/w%rd"


@dataclass(frozen=True)
class Database:
    """A database of its own on a cluster: ``url`` as superuser postgres."""

    server: PostgresServer
    name: str

    @property
    def url(self) -> str:
        return self.server.url_for(self.name)

    def url_as(self, user: str, password: str | None = None) -> str:
        secret = "" if password is None else ":" + quote(password, safe="")
        return f"postgresql://{user}{secret}@{self.server.host}:{self.server.port}/{self.name}"

    def query(self, text: str, *arguments: Any) -> list[tuple[Any, ...]]:
        with self.server.connect(self.name) as connection:
            return connection.execute(text, arguments).fetchall()

    def schemas(self) -> set[str]:
        """The semaphores' schemas in it (the tables' and each release's functions')."""
        rows = self.query("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", TABLES + "%")
        return {name for (name,) in rows}

    def rows_of(self, name: str) -> int:
        """How many semaphores named ``name`` its tables hold (0 if it has none)."""
        if not self.query("SELECT to_regclass(%s)", f"{TABLES}.semaphores")[0][0]:
            return 0
        return int(
            self.query(f"SELECT count(*) FROM {TABLES}.semaphores WHERE name = %s", name)[0][0]
        )

    def backends(self) -> set[int]:
        """The client connections to it, by backend pid."""
        rows = self.query(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            self.name,
        )
        return {pid for (pid,) in rows}

    def listeners(self) -> set[int]:
        """The connections whose last statement was a LISTEN (waiters in place)."""
        rows = self.query(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND query LIKE 'LISTEN %%'",
            self.name,
        )
        return {pid for (pid,) in rows}


@pytest.fixture
def database(postgres_session_server: PostgresServer) -> Iterator[Database]:
    """A fresh database on the session's cluster, dropped at teardown."""
    made = Database(postgres_session_server, f"cs_{uuid.uuid4().hex[:12]}")
    postgres_session_server.create_database(made.name)
    yield made
    postgres_session_server.drop_database(made.name)


@pytest.fixture
def own_database(postgres_server: PostgresServer) -> Database:
    """The ``postgres`` database of this test's own cluster (crash it, cut it off)."""
    return Database(postgres_server, "postgres")


def fresh_name() -> str:
    return f"pg-{uuid.uuid4().hex}"


def one_line(error: BaseException) -> str:
    message = str(error)
    assert message and "\n" not in message, repr(message)
    return message


def assert_hidden(secret: str, *shown: object) -> None:
    """Neither the password (as written in a URL or decoded), nor any part of it a
    parser might split off at a URL delimiter, is in what is shown: a semaphore's repr
    and url, an error's message, repr, args and traceback with its chained causes
    (what a log or Flower shows)."""
    texts = []
    for thing in shown:
        if isinstance(thing, BaseException):
            texts += ["".join(traceback.format_exception(thing)), repr(thing.args)]
        texts.append(repr(thing))
    text = "\n".join(texts)
    parts = {secret, quote(secret, safe="")}
    for delimiter in ":@/?#&":
        parts.update(part for part in secret.split(delimiter) if len(part) >= 3)
    for part in parts:
        assert part not in text, f"{part!r} shown in:\n{text}"


def failure(url: str, call: Callable[[Semaphore], object]) -> SemaphoreError:
    """The error ``call`` raises on a new `Semaphore` on ``url`` (closed after)."""
    sem = Semaphore(url, fresh_name(), 1)
    try:
        with pytest.raises(SemaphoreError) as info:
            call(sem)
    finally:
        sem.close()
    return info.value


def async_failure(url: str, call: Callable[[AsyncSemaphore], Awaitable[object]]) -> SemaphoreError:
    """`failure` with an `AsyncSemaphore`."""

    async def fail() -> SemaphoreError:
        sem = AsyncSemaphore(url, fresh_name(), 1)
        try:
            with pytest.raises(SemaphoreError) as info:
                await call(sem)
        finally:
            await sem.aclose()
        return info.value

    return asyncio.run(fail())


def failures(url: str) -> list[SemaphoreError]:
    """What a blocking acquire raises on ``url``, sync then asyncio: after the store's
    own retries at most (about 4 s, `backoff`), not after retrying until its timeout."""
    errors = []
    for fail in (failure, async_failure):
        started = time.monotonic()
        errors.append(fail(url, lambda sem: sem.acquire(timeout=10)))
        assert time.monotonic() - started < 7, "raised, not retried until the timeout"
    return errors


def in_place(sem: Semaphore) -> list[str]:
    """The waiters blocked in a wait that a release grants directly."""
    return [w.holder for w in sem.status().waiters if w.state == "waiting in place"]


# -------------------------------------------------------------------- bad input


def scram_role(server: PostgresServer, role: str, password: str) -> None:
    """A role that logs in with ``password`` (SCRAM, checked: the cluster trusts
    everyone else) and may create the semaphores' schemas in database postgres."""
    with server.connect() as connection:
        connection.execute("SET password_encryption = 'scram-sha-256'")
        connection.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(password)
            )
        )
        connection.execute(
            sql.SQL("GRANT CREATE ON DATABASE postgres TO {}").format(sql.Identifier(role))
        )
        hba = server.data_dir / "pg_hba.conf"
        hba.write_text(f"host all {role} {server.host}/32 scram-sha-256\n{hba.read_text()}")
        connection.execute("SELECT pg_reload_conf()")

    def asks_for_it() -> bool:
        try:
            psycopg.connect(f"postgresql://{role}@{server.host}:{server.port}/postgres").close()
        except psycopg.OperationalError as error:
            return "password" in str(error)
        return False

    wait_until(asks_for_it, 5, "pg_hba.conf to ask for the password")


def test_a_wrong_password_is_one_clear_line_and_writes_nothing(own_database: Database) -> None:
    scram_role(own_database.server, "app", SECRET)
    in_query = own_database.url_as("app") + "?password="
    for wrong, right in [
        (own_database.url_as("app", WRONG), own_database.url_as("app", SECRET)),
        (in_query + quote(WRONG, safe=""), in_query + quote(SECRET, safe="")),
    ]:
        for error in failures(wrong):
            assert isinstance(error, SemaphoreConnectionError)
            message = one_line(error)
            assert 'password authentication failed for user "app"' in message
            assert "put the right user/password in the URL" in message
            assert error.url in message and "***" in error.url
            assert_hidden(WRONG, error)
        assert own_database.schemas() == set(), "nothing was written"

        sem = Semaphore(right, fresh_name(), 1)
        try:
            permit = sem.acquire(timeout=5)
            assert [h.holder for h in sem.status().holders] == [permit.holder]
            assert permit.release()
            assert_hidden(SECRET, sem, sem.url)
        finally:
            sem.close()
        with own_database.server.connect() as connection:  # the next form starts afresh
            connection.execute(f"DROP SCHEMA {TABLES}, {FUNCTIONS} CASCADE")


def test_a_database_that_does_not_exist_is_named_with_what_to_do(
    postgres_session_server: PostgresServer,
) -> None:
    missing = f"cs_missing_{uuid.uuid4().hex[:8]}"
    url = postgres_session_server.url_for(missing)
    for error in failures(url):
        assert isinstance(error, SemaphoreConnectionError)
        message = one_line(error)
        assert f'database "{missing}" does not exist' in message
        assert "createdb" in message and url in message
    with postgres_session_server.connect() as connection:
        found = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (missing,))
        assert found.fetchone() is None


@pytest.fixture
def app_role(database: Database) -> Iterator[str]:
    """A role that may log in to ``database`` and nothing more (no CREATE on it)."""
    role = f"cs_app_{uuid.uuid4().hex[:8]}"
    with database.server.connect(database.name) as connection:
        connection.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        connection.execute(
            sql.SQL("REVOKE CREATE ON DATABASE {} FROM PUBLIC").format(
                sql.Identifier(database.name)
            )
        )
    yield role
    database.server.drop_database(database.name)  # its grants go with it
    with database.server.connect() as connection:
        connection.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_user_who_may_not_create_the_functions_is_told_to_migrate(
    database: Database, app_role: str
) -> None:
    url = database.url_as(app_role)
    for error in failures(url):
        assert isinstance(error, SemaphoreBackendError)
        message = one_line(error)
        assert "celery -A proj semaphore migrate" in message and "--sql" in message
        assert "permission denied" in message and FUNCTIONS in message
    assert database.schemas() == set(), "nothing was written"

    # What the message says to do: the DBA runs the --sql output and grants as told.
    with database.server.connect(database.name) as connection:
        connection.execute(sql_text())
        role = sql.Identifier(app_role)
        connection.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {}, {} TO {}").format(
                sql.Identifier(TABLES), sql.Identifier(FUNCTIONS), role
            )
        )
        connection.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO {}").format(
                sql.Identifier(TABLES), role
            )
        )
    sem = Semaphore(url, fresh_name(), 1)
    try:
        permit = sem.acquire(timeout=5)
        place = sem.attempt("second")
        assert isinstance(place, Place) and place.position == 1
        assert permit.release()
        second = sem.attempt("second", place.ticket)
        assert isinstance(second, Permit) and second.release()
        assert sem.status().holder_count == 0
    finally:
        sem.close()


def test_a_read_only_database_is_an_error_of_the_package(database: Database) -> None:
    """A hot standby, or a database set read-only: psycopg's error becomes the
    package's (a waiter's retry loop catches only those)."""
    with database.server.connect() as connection:
        connection.execute(
            sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(
                sql.Identifier(database.name)
            )
        )
    for error in failures(database.url):
        assert isinstance(error, SemaphoreBackendError)
        message = one_line(error)
        assert "read-only transaction" in message and database.url in message
    assert database.schemas() == set(), "nothing was written"


@pytest.mark.chaos
def test_a_parked_payload_outlives_a_crash_and_is_handed_over_after_it(
    own_database: Database,
) -> None:
    """What parks in PostgreSQL is as safe as its WAL: a crash right after park()
    returned keeps the payload, and the release after the restart hands it over."""
    server, name = own_database.server, fresh_name()
    told: list[Handover] = []
    sem = Semaphore(own_database.url, name, 1, on_handover=told.extend)
    try:
        permit = sem.acquire(timeout=5)
        assert sem.park("parked-task", "the task's message").position == 1
        server.crash()
        server.start()
        status = sem.status()
        assert status.parked_count == 1
        assert [(w.holder, w.state) for w in status.waiters] == [("parked-task", "parked")]
        assert permit.release()
        (handover,) = told
        assert (handover.holder, handover.payload) == ("parked-task", "the task's message")
        granted = sem.attempt("parked-task", handover=handover.token)
        assert isinstance(granted, Permit), granted
        assert granted.release()
        assert sem.status().parked_count == 0
    finally:
        sem.close()


def test_rate_shadow_fair_weights_and_on_handover_are_taken_on_postgresql(
    database: Database,
) -> None:
    """support.py: the store does these (only parking calls are refused)."""
    sem = Semaphore(
        database.url,
        fresh_name(),
        1,
        rate="100/s",
        shadow=["limit"],
        fair_weights={"a": 3},
        on_handover=lambda handovers: None,
    )
    try:
        first = sem.acquire(timeout=5, fair_key="a")
        second = sem.acquire(timeout=5, fair_key="b")  # admitted: the limit is a shadow
        assert second.shadow_refused == {"limit"}
        status = sem.status()
        assert str(status.rate) == "100/s" and status.shadow == {"limit"}
        assert status.shadow_limit_refusals == 1 and status.holder_count == 2
        assert first.release() and second.release()
    finally:
        sem.close()


# ------------------------------------------------------------- the password hidden

UNREACHABLE = [
    # (id, URL with {pw} and {port})
    ("user-info", "postgresql://app:{pw}@127.0.0.1:{port}/db"),
    ("query", "postgresql://app@127.0.0.1:{port}/db?password={pw}"),
    ("sqlalchemy-scheme", "postgresql+psycopg://app:{pw}@127.0.0.1:{port}/db"),
    ("bad-percent-encoding", "postgresql://app:{pw}%zz@127.0.0.1:{port}/db"),
    ("unclosed-ipv6-host", "postgresql://app:{pw}@[::1:{port}/db"),
    ("unencoded-?", "postgresql://app:{pw}?x@127.0.0.1:{port}/db"),
]


@pytest.mark.parametrize("template", [t for _, t in UNREACHABLE], ids=[i for i, _ in UNREACHABLE])
def test_the_password_never_shows(template: str) -> None:
    """libpq echoes a URL it cannot parse, and a password with a bad %-escape."""
    password = "hunter2-s3cret"
    url = template.format(pw=password, port=free_port())
    errors = failures(url)
    for error in errors:
        assert isinstance(error, SemaphoreConnectionError)
        assert "***" in one_line(error) and "***" in error.url
    sem = Semaphore(url, "n", 1)
    sem.close()
    assert_hidden(password, sem, sem.url, *errors)


@pytest.mark.parametrize("password", ["hunter2@s3cret-x", "hunter2/s3cret-x"], ids=["@", "/"])
def test_a_password_libpq_would_split_is_refused_without_showing_it(password: str) -> None:
    """libpq ends the user-info at the first "@" and the host at the first "/": it
    would take part of such a password for the host, the port or the database."""
    url = f"postgresql://app:{password}@127.0.0.1:1/db"
    for make in (Semaphore, AsyncSemaphore):
        with pytest.raises(ValueError, match="percent-encode") as info:
            make(url, "n", 1)
        assert_hidden(password, info.value)


# --------------------------------------------------------------- libpq settings


def test_libpq_settings_in_the_url_reach_the_server(database: Database) -> None:
    application = f"cs-app-{uuid.uuid4().hex[:8]}"
    url = f"{database.url}?sslmode=disable&application_name={application}"
    sem = Semaphore(url, fresh_name(), 1)
    try:
        permit = sem.acquire(timeout=5)
        rows = database.query(
            "SELECT a.application_name, s.ssl FROM pg_stat_activity a"
            " JOIN pg_stat_ssl s USING (pid) WHERE a.datname = %s AND a.pid <> pg_backend_pid()",
            database.name,
        )
        assert rows == [(application, False)]
        assert permit.release()
    finally:
        sem.close()
    # Settings are not dropped on the way: one the server cannot meet fails.
    error = failure(f"{database.url}?sslmode=require", lambda sem: sem.status())
    assert isinstance(error, SemaphoreConnectionError)
    assert "SSL was required" in one_line(error)


@pytest.mark.parametrize("scheme", ["postgres://", "postgresql+psycopg://"])
def test_other_spellings_of_the_scheme(database: Database, scheme: str) -> None:
    url = database.url.replace("postgresql://", scheme, 1)
    sem = Semaphore(url, fresh_name(), 1)
    try:
        permit = sem.acquire(timeout=5)
        assert [h.holder for h in sem.status().holders] == [permit.holder]
        assert permit.release()
    finally:
        sem.close()


# ------------------------------------------------------------- waking in place


def test_a_release_grants_a_waiter_in_place_without_it_asking(database: Database) -> None:
    sem = Semaphore(database.url, fresh_name(), 1)
    try:
        permit = sem.acquire(timeout=5)
        place = sem.attempt("waiter", in_place=True)
        assert isinstance(place, Place) and in_place(sem) == ["waiter"]
        assert permit.release()
        (holder,) = sem.status().holders
        assert holder.holder == "waiter", "the release granted it the permit"
        again = sem.attempt("waiter", place.ticket)
        assert isinstance(again, Permit), "its next ask finds that permit"
        assert again.release()
    finally:
        sem.close()


def test_a_release_wakes_a_blocked_waiter_at_once(database: Database) -> None:
    name = fresh_name()
    holding = Semaphore(database.url, name, 1, recheck_interval=RECHECK)
    waiting = Semaphore(database.url, name, 1, recheck_interval=RECHECK)
    outcome: dict[str, Any] = {}

    def wait() -> None:
        try:
            outcome["permit"] = waiting.acquire(timeout=3 * RECHECK, holder="waiter")
            outcome["at"] = time.monotonic()
        except BaseException as error:  # reported by the main thread
            outcome["error"] = error

    try:
        permit = holding.acquire(timeout=5)
        thread = threading.Thread(target=wait)
        thread.start()
        try:
            wait_until(lambda: in_place(holding) == ["waiter"], 5, "the waiter to wait in place")
            time.sleep(0.2)  # past its last ask: asleep until a notification
            released_at = time.monotonic()
            assert permit.release()
            assert [h.holder for h in holding.status().holders] == ["waiter"]
        finally:
            thread.join(3 * RECHECK + 5)
        assert "error" not in outcome, outcome.get("error")
        delay = outcome["at"] - released_at
        assert delay < WAKE_BOUND, f"the waiter got the permit {delay:.2f}s after the release"
        assert outcome["permit"].release()
        assert holding.status().holder_count == 0
    finally:
        holding.close()
        waiting.close()


def test_a_release_wakes_a_blocked_asyncio_waiter_at_once(database: Database) -> None:
    async def scenario() -> None:
        name = fresh_name()
        holding = AsyncSemaphore(database.url, name, 1, recheck_interval=RECHECK)
        waiting = AsyncSemaphore(database.url, name, 1, recheck_interval=RECHECK)
        try:
            permit = await holding.acquire(timeout=5)
            place = await holding.attempt("second")
            assert isinstance(place, Place) and place.position == 1
            await holding.release("second")  # its place
            assert (await holding.status()).waiter_count == 0
            waiter = asyncio.create_task(waiting.acquire(timeout=3 * RECHECK, holder="waiter"))

            async def waits_in_place() -> None:
                while [w.state for w in (await holding.status()).waiters] != ["waiting in place"]:
                    await asyncio.sleep(0.02)

            await asyncio.wait_for(waits_in_place(), 5)
            await asyncio.sleep(0.2)  # past its last ask: asleep until a notification
            released_at = time.monotonic()
            assert await permit.release()
            got = await asyncio.wait_for(waiter, 3 * RECHECK)
            delay = time.monotonic() - released_at
            assert delay < WAKE_BOUND, f"the waiter got the permit {delay:.2f}s after the release"
            assert got.holder == "waiter"
            assert [h.holder for h in (await holding.status()).holders] == ["waiter"]
            assert await got.release()
        finally:
            await holding.aclose()
            await waiting.aclose()

    asyncio.run(scenario())


# ------------------------------------------------------ installing the functions


def install_and_acquire(url: str, name: str, start: Any, results: Any) -> None:
    """In a child process: a semaphore's first call (which installs the functions)
    once every child is ready."""
    sem = Semaphore(url, name, 4)
    try:
        start.wait(10)
        permit = sem.acquire(timeout=10)
        results.put(("ok", permit.release()))
    except BaseException as error:
        results.put(("error", repr(error)))
    finally:
        sem.close()


def test_processes_starting_at_once_install_the_functions_once(database: Database) -> None:
    assert database.schemas() == set()
    processes = 4
    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(processes), context.Queue()
    children = [
        context.Process(
            target=install_and_acquire, args=(database.url, fresh_name(), start, results)
        )
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    outcomes = [results.get(timeout=30) for _ in children]
    for child in children:
        child.join(10)
    assert outcomes == [("ok", True)] * processes
    assert [child.exitcode for child in children] == [0] * processes
    assert database.schemas() == {TABLES, FUNCTIONS}
    assert database.query(f"SELECT functions FROM {TABLES}.versions") == [(FUNCTIONS,)]


# ------------------------------------------------ crashes, cut-off clients, fork


def blocked_waiter(sem: Semaphore, outcome: dict[str, Any]) -> threading.Thread:
    """A thread blocked in ``sem.acquire`` as holder "waiter"; its result in ``outcome``."""

    def wait() -> None:
        try:
            outcome["permit"] = sem.acquire(timeout=30, holder="waiter")
            outcome["at"] = time.monotonic()
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=wait)
    thread.start()
    return thread


@pytest.mark.chaos
def test_a_crash_keeps_the_permit_and_the_next_call_reconnects(own_database: Database) -> None:
    server, name = own_database.server, fresh_name()
    holding = Semaphore(own_database.url, name, 1, recheck_interval=RECHECK)
    waiting = Semaphore(own_database.url, name, 1, recheck_interval=RECHECK)
    outcome: dict[str, Any] = {}
    try:
        permit = holding.acquire(timeout=5)
        thread = blocked_waiter(waiting, outcome)
        try:
            wait_until(lambda: in_place(holding) == ["waiter"], 5, "the waiter to wait in place")
            server.crash()
            with pytest.raises(SemaphoreConnectionError) as info:
                holding.status()  # asked again on a new connection, which fails too
            assert own_database.url in one_line(info.value)
            server.start()
            status = holding.status()
            (held,) = status.holders
            assert (held.holder, held.fencing_token) == (permit.holder, permit.fencing_token)
            assert [w.holder for w in status.waiters] == ["waiter"], "its place is kept too"
            released_at = time.monotonic()
            assert permit.release()
        finally:
            thread.join(35)
        assert "error" not in outcome, outcome.get("error")
        delay = outcome["at"] - released_at
        # It reconnects (backing off 1 s at most) and asks with its ticket, or was
        # listening again already: either way not a re-check interval later.
        assert delay < RECHECK - 1, f"the waiter got the permit {delay:.2f}s after the release"
        assert outcome["permit"].release()
    finally:
        holding.close()
        waiting.close()


@pytest.mark.chaos
def test_a_call_on_a_cut_off_connection_asks_again_on_a_new_one(
    own_database: Database,
) -> None:
    server, name = own_database.server, fresh_name()
    holding = Semaphore(own_database.url, name, 1, recheck_interval=RECHECK)
    waiting = Semaphore(own_database.url, name, 1, recheck_interval=RECHECK)
    outcome: dict[str, Any] = {}
    try:
        permit = holding.acquire(timeout=5)
        thread = blocked_waiter(waiting, outcome)
        try:
            wait_until(lambda: in_place(holding) == ["waiter"], 5, "the waiter to wait in place")
            (listener,) = own_database.listeners()
            before = own_database.backends()
            assert server.terminate_backends() >= 3  # the holder's, the waiter's two
            assert permit.renew(), "it reconnects and asks again; the permit is still there"
            assert own_database.backends() - before, "on a new connection"
            wait_until(
                lambda: len(own_database.listeners() - {listener}) == 1,
                5,
                "the waiter to listen again on a new connection",
            )
            released_at = time.monotonic()
            assert permit.release()
        finally:
            thread.join(35)
        assert "error" not in outcome, outcome.get("error")
        delay = outcome["at"] - released_at
        assert delay < WAKE_BOUND, f"the waiter got the permit {delay:.2f}s after the release"
        assert outcome["permit"].release()
    finally:
        holding.close()
        waiting.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_uses_a_connection_of_its_own(database: Database) -> None:
    sem = Semaphore(database.url, fresh_name(), 2)
    try:
        permit = sem.acquire(timeout=5)
        (parents,) = database.backends()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: the parent's semaphore, on a connection of its own
            try:
                seen = [h.holder for h in sem.status().holders] == [permit.holder]
                mine = sem.acquire(timeout=5)
                ok = seen and mine.release() and sem.status().holder_count == 1
                sem.close()
                os.write(write, b"1" if ok else b"0")
            finally:
                os._exit(0)
        os.close(write)
        answer = os.read(read, 1)
        os.close(read)
        os.waitpid(pid, 0)
        assert answer == b"1", "the child saw the parent's permit and took its own"
        wait_until(lambda: database.backends() == {parents}, 5, "the child's connection to end")
        assert sem.status().holder_count == 1, "the parent's connection still works"
        assert permit.release()
        assert database.backends() == {parents}, "on the same connection as before the fork"
    finally:
        sem.close()


def test_threads_connecting_at_once_share_one_connection_and_drop_none_open(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads of one process make their first call at once (or after the connection
    was lost): each connects, and the one that comes second closes its connection and
    uses the first's. One left open and dropped is a connection the server keeps until
    the garbage collector finds it (psycopg warns then: the chaos test's observer and
    main thread met it after a pg_terminate_backend)."""
    from celery_semaphore.core.postgres._sync import store as module

    made: list[Any] = []
    both = threading.Barrier(2)

    def slow_connect(url: str) -> Any:
        connection = real_connect(url)
        made.append(connection)
        both.wait(5)  # both threads hold a new connection before either uses it
        return connection

    real_connect = module.connect
    monkeypatch.setattr(module, "connect", slow_connect)
    sem = Semaphore(database.url, fresh_name(), 2)
    try:
        threads = [threading.Thread(target=sem.status) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert len(made) == 2
        assert sorted(c.closed for c in made) == [False, True], "one kept, the other closed"
        assert sem.status().holder_count == 0
        assert len(database.backends()) == 1
    finally:
        sem.close()
