"""The real ``celery -A app semaphore ...`` on an app whose ``semaphore_url`` is a
PostgreSQL database: ``migrate`` (and ``--sql``), and ``status`` of a semaphore held
there. Each test has a database of its own on the session's cluster."""

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
    semaphore's own status; the parked side is empty (nothing parks here yet)."""
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
