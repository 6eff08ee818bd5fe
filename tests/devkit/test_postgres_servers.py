"""Self-tests for the PostgreSQL cluster fixtures, so a broken fixture fails here, not elsewhere."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import psycopg
import pytest

import devkit.postgres_servers as servers
from devkit.postgres_servers import PostgresBinaryNotFoundError, PostgresServer


def test_session_server_answers(postgres_session_server: PostgresServer) -> None:
    server = postgres_session_server
    assert server.port != 5432
    assert server.url == f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
    with psycopg.connect(server.url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.execute("SHOW fsync").fetchone() == ("off",)
        assert conn.execute("SHOW max_connections").fetchone() == ("300",)

    name = f"t-{uuid.uuid4().hex}"
    server.create_database(name)
    with server.connect(name) as conn:  # still open: drop_database cuts it off
        assert conn.execute("SELECT current_database()").fetchone() == (name,)
        server.drop_database(name)
    with pytest.raises(psycopg.OperationalError, match="does not exist"):
        server.connect(name)


@pytest.mark.chaos
def test_crash_keeps_the_data_and_the_port(postgres_server: PostgresServer) -> None:
    port, pid = postgres_server.port, postgres_server.pid
    with postgres_server.connect() as conn:
        conn.execute("CREATE TABLE t (v text)")
        conn.execute("INSERT INTO t VALUES ('committed')")
        postgres_server.crash()

        assert postgres_server.pid is None
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")

    postgres_server.start()
    assert postgres_server.port == port
    assert postgres_server.pid not in (None, pid)
    with postgres_server.connect() as conn:
        assert conn.execute("SELECT v FROM t").fetchall() == [("committed",)]

    postgres_server.restart()
    with postgres_server.connect() as conn:
        assert conn.execute("SELECT v FROM t").fetchall() == [("committed",)]


@pytest.mark.chaos
def test_terminate_backends_breaks_open_connections(postgres_server: PostgresServer) -> None:
    postgres_server.create_database("other")
    with postgres_server.connect() as first, postgres_server.connect("other") as second:
        assert postgres_server.terminate_backends("other") == 1
        with pytest.raises(psycopg.OperationalError, match="administrator command"):
            second.execute("SELECT 1")
        assert first.execute("SELECT 1").fetchone() == (1,)

        assert postgres_server.terminate_backends() == 1
        with pytest.raises(psycopg.OperationalError, match="administrator command"):
            first.execute("SELECT 1")
    assert postgres_server.terminate_backends() == 0


def test_stop_removes_the_directory_and_the_port(postgres_server: PostgresServer) -> None:
    directory = postgres_server.dir

    postgres_server.stop()  # the fixture stops it again: stop() must be idempotent

    assert not directory.exists()
    assert postgres_server.pid is None
    with pytest.raises(psycopg.OperationalError, match="refused"):
        postgres_server.connect()
    with pytest.raises(RuntimeError, match="directory deleted"):
        postgres_server.start()


def test_port_collision_is_retried(
    monkeypatch: pytest.MonkeyPatch, postgres_session_server: PostgresServer
) -> None:
    squatter = postgres_session_server
    ports = iter([squatter.port, servers.free_port()])
    monkeypatch.setattr(servers, "free_port", lambda: next(ports))

    with PostgresServer() as server, server.connect() as conn:
        assert next(ports, None) is None
        assert server.port != squatter.port
        assert conn.execute("SHOW data_directory").fetchone() == (str(server.data_dir),)


def test_missing_initdb_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(servers, "_DEBIAN_ROOT", tmp_path)

    with pytest.raises(PostgresBinaryNotFoundError, match="postgresql-15"):
        PostgresServer()
