"""The real ``celery -A app semaphore ...`` on an app whose ``semaphore_url`` is a
PostgreSQL database: ``migrate`` (and ``--sql``), ``status`` of a semaphore held there,
and the parked side (rows written straight into the ``parked`` table) as the CLI, the
metrics and a worker read it. Each test has a database of its own on the session's
cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from celery_semaphore import Permit, Place, Semaphore
from celery_semaphore.core.operations import operated_store
from celery_semaphore.core.postgres import schema
from celery_semaphore.core.rates import parse_rate
from devkit.redis_servers import free_port

APP = """
import os
from celery import Celery

app = Celery("pg_cli_app", broker="memory://")
app.conf.semaphore_url = os.environ["CS_STORE_URL"]
"""


@pytest.fixture
def database(postgres_session_server: Any) -> Iterator[str]:
    """The URL of a new, empty database on the session's cluster."""
    name = f"cli_{uuid.uuid4().hex}"
    with postgres_session_server.connect() as connection:
        connection.execute(f"CREATE DATABASE {name}")
    yield postgres_session_server.url_for(name)
    with postgres_session_server.connect() as connection:
        connection.execute(f"DROP DATABASE {name} WITH (FORCE)")


def run(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``celery -A pg_cli_app semaphore ARGS`` with ``semaphore_url = url``."""
    (tmp_path / "pg_cli_app.py").write_text(APP)
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "pg_cli_app", "semaphore", *args],
        env={**os.environ, "CS_STORE_URL": url, "PYTHONPATH": path},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_migrate_sql_prints_the_script_and_connects_to_nothing(tmp_path: Path) -> None:
    nowhere = f"postgresql://app:s3cret@127.0.0.1:{free_port()}/jobs"
    out = run(tmp_path, nowhere, "migrate", "--sql")
    assert out.returncode == 0, out.stderr
    assert out.stdout == schema.sql_text()
    assert f"CREATE FUNCTION {schema.FUNCTIONS}." in out.stdout


def test_migrate_installs_once_then_says_it_is_installed(tmp_path: Path, database: str) -> None:
    line = f"version {schema.VERSION} (functions schema {schema.FUNCTIONS}) at {database}\n"
    first = run(tmp_path, database, "migrate")
    assert (first.returncode, first.stdout, first.stderr) == (0, f"installed {line}", "")
    again = run(tmp_path, database, "migrate")
    assert (again.returncode, again.stdout) == (0, f"already installed: {line}")


def test_status_shows_the_holder_of_a_postgresql_semaphore(tmp_path: Path, database: str) -> None:
    sem = Semaphore(database, "partner-api", 2)
    try:
        assert isinstance(sem.acquire(holder="task-a"), Permit)
        out = run(tmp_path, database, "status", "--json")  # every semaphore in the database
        assert out.returncode == 0, out.stderr
        (row,) = json.loads(out.stdout)
        assert (row["name"], row["holders"], row["waiters"]) == ("partner-api", 1, 0)
        assert (row["declared_limit"], row["effective_limit"]) == (2, 2)
        table = run(tmp_path, database, "status", "partner-api").stdout.splitlines()
        assert table[1].split()[:4] == ["partner-api", "2", "1", "0"]  # LIMIT HOLD WAIT
        unknown = run(tmp_path, database, "status", "partner-apj")
        assert unknown.returncode == 1
        assert unknown.stderr.startswith("Error: no semaphore named 'partner-apj' in PostgreSQL")
        assert "did you mean 'partner-api'?" in unknown.stderr
    finally:
        sem.close()


def test_the_operators_side_reads_the_tables(database: str) -> None:
    """What `status`, `set-limit` and the metrics ask of the store, beyond a
    semaphore's own status; nothing parked: the parked side is empty, and no worker
    listens to be woken."""
    held = Semaphore(database, "cust-1", 1, rate="10/s", family="customer")
    planned = Semaphore(database, "launch", 5)
    store = operated_store(database)
    try:
        assert isinstance(held.acquire(holder="a"), Permit)
        assert isinstance(held.attempt("b", wait_lease=60), Place)
        assert planned.set_limit(3) is None  # before its first use: no recorded limit
        assert store.semaphore_names("celery_semaphore") == ["cust-1", "launch"]
        assert store.semaphore_names("elsewhere") == []
        assert store.recorded_limit("celery_semaphore", "cust-1") == 1
        assert store.recorded_limit("celery_semaphore", "launch") is None
        assert store.recorded_limit("celery_semaphore", "launch", override_only=True) == 3
        assert store.recorded_limit("celery_semaphore", "nope", override_only=True) is None
        assert store.recorded_rate("celery_semaphore", "cust-1") == parse_rate("10/s")
        assert store.recorded_rate("celery_semaphore", "launch") is None
        names = ["launch", "cust-1", "nope"]
        assert store.recorded_families("celery_semaphore", names) == [None, "customer", None]
        (counts,) = store.counts("celery_semaphore", names, ("family", "m_expired", "m_x"))
        assert (counts.name, counts.holder_count, counts.waiter_count) == ("cust-1", 1, 1)
        assert (counts.declared_limit, counts.effective_limit, counts.draining) == (1, 1, False)
        assert (counts.rate, counts.fields) == (
            parse_rate("10/s"),
            {"family": "customer", "m_expired": "0", "m_x": ""},
        )
        assert abs(counts.server_time - time.time()) < 5
        assert store.parked_counts("celery_semaphore", names) == dict.fromkeys(names, 0)
        assert store.semaphore_names("celery_semaphore", parked=True) == []
        assert store.parked_index("celery_semaphore").names == []
        assert store.wake_workers("celery_semaphore", "cust-1") == 0
        assert store.last_data_loss("celery_semaphore") == (0.0, 0.0, 0.0)
        with psycopg.connect(database) as connection:
            fsync = connection.execute("SHOW fsync").fetchone()
        assert store.persistence().every_write is (fsync == ("on",))  # off on test clusters
        assert store.eviction_policy() is None
        store.ping()
    finally:
        for closing in (held, planned, store):
            closing.close()


PARK = """
INSERT INTO celery_semaphore.parked (semaphore, holder, token, state, payload)
SELECT id, %s, %s, %s, 'payload' FROM celery_semaphore.semaphores
WHERE namespace = %s AND name = %s
"""


def park_rows(database: str, namespace: str, name: str, states: dict[str, str]) -> None:
    """Write a parked record for each holder of ``states`` (its state) into the table."""
    with psycopg.connect(database, autocommit=True) as connection:
        for n, (holder, state) in enumerate(states.items(), 1):
            token = 0 if state == "p" else n  # a handover's token, or a tombstone's
            cursor = connection.execute(PARK, (holder, token, state, namespace, name))
            assert cursor.rowcount == 1, f"no semaphore {name!r} in {namespace!r}"


def heard_within(watching: Any, seconds: float) -> bool:
    """Whether ``watching`` hears a command within ``seconds`` (a NOTIFY reaches a
    listening connection a moment after its sender's commit)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if watching.heard():
            return True
        time.sleep(0.01)
    return False


def test_the_parked_side_reads_the_parked_table(tmp_path: Path, database: str) -> None:
    """A semaphore has parked tasks while it has records parked (p) or handed over
    (h): those are listed (``parked=True``, the worker's parked index); each is counted
    on its own, and ``parked_counts`` counts the parked ones only, as the Redis store's
    n_parked. Tombstones (d, x) and waiters in place (w) are no parked tasks; neither
    is a semaphore idle past its idle time, nor one of another namespace."""
    sems = {name: Semaphore(database, name, 1) for name in ("busy", "handed", "tombstones", "none")}
    elsewhere = Semaphore(database, "busy", 1, namespace="elsewhere")
    gone = Semaphore(database, "gone", 1)
    store = operated_store(database)
    try:
        for sem in [*sems.values(), elsewhere, gone]:
            assert isinstance(sem.acquire(holder="holder"), Permit)
            for waiter in ("w1", "w2", "w3"):
                assert isinstance(sem.attempt(waiter, wait_lease=60), Place)
        park_rows(database, "celery_semaphore", "busy", {"w1": "p", "w2": "h", "w3": "p"})
        park_rows(database, "celery_semaphore", "handed", {"w1": "h"})
        park_rows(database, "celery_semaphore", "tombstones", {"w1": "d", "w2": "x", "w3": "w"})
        park_rows(database, "elsewhere", "busy", {"w1": "p"})
        park_rows(database, "celery_semaphore", "gone", {"w1": "p", "w2": "h"})
        with psycopg.connect(database, autocommit=True) as connection:
            connection.execute(
                "UPDATE celery_semaphore.semaphores SET used_ms = 0 WHERE name = 'gone'"
            )
            connection.execute(
                "INSERT INTO celery_semaphore.fair_keys (semaphore, key, waiting) "
                "SELECT id, 'tenant-1', 1 FROM celery_semaphore.semaphores "
                "WHERE namespace = 'celery_semaphore' AND name = 'busy'"
            )

        assert store.semaphore_names("celery_semaphore", parked=True) == ["busy", "handed"]
        assert store.semaphore_names("elsewhere", parked=True) == ["busy"]
        index = store.parked_index("celery_semaphore")
        assert index.names == ["busy", "handed"]
        index.forget_idle()  # a query: nothing to forget
        assert store.parked_index("celery_semaphore").names == ["busy", "handed"]
        names = ["busy", "handed", "tombstones", "none", "gone", "nope"]
        assert store.parked_counts("celery_semaphore", names) == {
            "busy": 2, "handed": 0, "tombstones": 0, "none": 0, "gone": 0, "nope": 0,
        }  # fmt: skip
        assert store.parked_counts("elsewhere", ["busy"]) == {"busy": 1}
        counted = {
            c.name: (c.parked_count, c.handed_over_count, c.fair_keys_waiting)
            for c in store.counts("celery_semaphore", names)
        }
        assert counted == {
            "busy": (2, 1, 1), "handed": (0, 1, 0), "tombstones": (0, 0, 0), "none": (0, 0, 0),
        }  # fmt: skip

        out = run(tmp_path, database, "status", "--json")
        assert out.returncode == 0, out.stderr
        rows = {row["name"]: row for row in json.loads(out.stdout)}
        assert {name: (r["parked"], r["handed_over"]) for name, r in rows.items()} == {
            "busy": (2, 1), "handed": (0, 1), "tombstones": (0, 0), "none": (0, 0),
        }  # fmt: skip
        # the app's broker (memory://) has no parking queues: they park in the store
        assert rows["busy"]["parked_in"] == "in the semaphores' PostgreSQL"
        text = run(tmp_path, database, "status", "busy").stdout.splitlines()
        assert text[-1] == "PARKED: their messages wait in the semaphores' PostgreSQL."
    finally:
        for closing in [*sems.values(), elsewhere, gone, store]:
            closing.close()


def test_an_operators_change_wakes_the_workers_that_watch_the_namespace(
    tmp_path: Path, database: str
) -> None:
    """``resume`` of a semaphore with parked tasks asks every worker watching its
    namespace to beat now (NOTIFY); the CLI says how many heard. A worker watching
    another namespace hears nothing, and a closed watch no longer counts."""
    sem = Semaphore(database, "partner-api", 1)
    store = operated_store(database)
    watching = store.watch("celery_semaphore")
    other = store.watch("elsewhere")
    try:
        assert isinstance(sem.acquire(holder="holder"), Permit)
        assert isinstance(sem.attempt("w1", wait_lease=60), Place)
        park_rows(database, "celery_semaphore", "partner-api", {"w1": "p"})
        assert not watching.heard()
        assert sem.set_draining(True) is False
        out = run(tmp_path, database, "resume", "partner-api")
        assert (out.returncode, out.stderr) == (0, ""), out.stderr
        assert out.stdout == (
            "partner-api: admitting again; 1 worker was asked to hand over its parked tasks "
            "now due (1 parked)\n"
        )
        assert heard_within(watching, 5)
        assert not watching.heard()  # heard once
        assert not heard_within(other, 0.2)
        assert store.wake_workers("elsewhere", "partner-api") == 1
        assert heard_within(other, 5)
        assert not watching.heard()
    finally:
        watching.close()
        other.close()
    try:
        deadline = time.monotonic() + 5
        while (heard := store.wake_workers("celery_semaphore", "partner-api")) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.01)  # a backend leaves pg_stat_activity a moment after its close
        assert heard == 0
    finally:
        sem.close()
        store.close()


def test_migrate_errors_are_one_line_without_the_password(tmp_path: Path) -> None:
    port = free_port()
    out = run(tmp_path, f"postgresql://app:s3cret@127.0.0.1:{port}/jobs", "migrate")
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr.startswith(f"Error: PostgreSQL at postgresql://app:***@127.0.0.1:{port}/")
    assert out.stderr.endswith("; the URL comes from semaphore_url\n")
    assert out.stderr.count("\n") == 1
    assert "s3cret" not in out.stderr


def test_migrate_as_a_user_that_may_not_create_schemas_says_what_to_do(
    tmp_path: Path, database: str, postgres_session_server: Any
) -> None:
    role = f"app_{uuid.uuid4().hex[:12]}"
    with postgres_session_server.connect() as connection:
        connection.execute(f"CREATE ROLE {role} LOGIN")  # trust: any password is accepted
    try:
        url = database.replace("postgres@", f"{role}:s3cret@")
        out = run(tmp_path, url, "migrate")
    finally:
        with postgres_session_server.connect() as connection:
            connection.execute(f"DROP ROLE {role}")
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr.startswith(
        f"Error: PostgreSQL at {url.replace('s3cret', '***')} refused to create the "
        f"semaphores' functions ({schema.FUNCTIONS}): permission denied"
    )
    assert "run `celery -A proj semaphore migrate` as a user that may create schemas" in out.stderr
    assert out.stderr.count("\n") == 1
    assert "s3cret" not in out.stderr


def test_migrate_on_a_redis_store_has_nothing_to_do(tmp_path: Path) -> None:
    out = run(tmp_path, f"redis://127.0.0.1:{free_port()}/0", "migrate")
    assert (out.returncode, out.stdout) == (
        0,
        "nothing to migrate: the Redis store loads its library itself\n",
    )


def test_the_metrics_read_the_shadow_counters(database: str) -> None:
    """What a shadow limit would have refused is counted in the semaphore's row and read
    by the metrics as the Redis store's meta counters are."""
    sem = Semaphore(database, "shadowed", 1, shadow=["limit"])
    first, second = sem.acquire(), sem.acquire()
    assert second.shadow_refused == {"limit"}
    store = operated_store(database)
    try:
        fields = ("m_shadow_limit", "m_shadow_peak", "m_shadow_rate", "m_expired")
        (counts,) = store.counts("celery_semaphore", ["shadowed"], fields)
        assert counts.fields == {
            "m_shadow_limit": "1",
            "m_shadow_peak": "2",
            "m_shadow_rate": "0",
            "m_expired": "0",
        }
    finally:
        first.release()
        second.release()
        store.close()
        sem.close()
