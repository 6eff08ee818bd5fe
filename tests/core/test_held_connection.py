"""The connection a client keeps for the package's script calls (held_connection.py),
on a real redis-server: the reply a call gets is its own, whatever happened to the
connection before (a restart, an interrupted call, a fork, another thread)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from outcomes import granted

from celery_semaphore import Semaphore
from celery_semaphore.core.redis.held_connection import BUSY, HeldConnection, _lend, holds
from celery_semaphore.core.redis.scripts import library_of
from devkit.redis_servers import RedisServer


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as made:
        yield made


def address(held: HeldConnection) -> str:
    """The client address Redis sees for the held connection (``CLIENT INFO``'s addr)."""
    info = held.call("CLIENT", "INFO").decode()
    return next(f for f in info.split() if f.startswith("addr=")).partition("=")[2]


def last_commands(admin: redis.Redis) -> dict[str, str]:
    """Each connected client's address and the last command it sent."""
    return {c["addr"]: c["cmd"] for c in admin.client_list()}


def test_calls_of_one_thread_share_one_connection_of_the_pool(server: RedisServer) -> None:
    with server.client() as client:
        held = HeldConnection(client)
        first = address(held)
        assert [address(held) for _ in range(5)] == [first] * 5
        assert held.call("ECHO", "x") == b"x"
        with pytest.raises(redis.ResponseError):
            held.call("NO-SUCH-COMMAND")
        assert address(held) == first  # an error reply keeps the connection


def test_a_restart_between_calls_connects_again_without_an_error(server: RedisServer) -> None:
    with server.client() as client:
        held = HeldConnection(client)
        before = address(held)
        server.restart()
        assert held.call("ECHO", "after") == b"after"
        assert address(held) != before


def test_a_call_interrupted_after_sending_never_hands_its_reply_to_the_next(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with server.client() as client:
        held = HeldConnection(client)
        held.call("PING")
        connection: Any = held._connection
        real_read = connection.read_response

        def interrupted(*args: Any, **kwargs: Any) -> Any:
            raise KeyboardInterrupt  # a signal (a soft time limit) between send and read

        monkeypatch.setattr(connection, "read_response", interrupted)
        with pytest.raises(KeyboardInterrupt):
            held.call("ECHO", "first")
        monkeypatch.setattr(connection, "read_response", real_read)
        assert held.call("ECHO", "second") == b"second"


def test_another_thread_finds_it_busy_and_takes_the_usual_path(server: RedisServer) -> None:
    with server.client() as client:
        held = HeldConnection(client)
        held.call("PING")
        seen: list[Any] = []
        with held._lock:
            thread = threading.Thread(target=lambda: seen.append(held.call("PING")))
            thread.start()
            thread.join(5)
        assert seen == [BUSY]
        assert held.call("PING") == b"PONG"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_takes_its_own_connection(server: RedisServer) -> None:
    with server.client() as client:
        held = HeldConnection(client)
        parent = address(held)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its own connection, and the parent's left alone
            try:
                os.write(write, address(held).encode())
            finally:
                os._exit(0)
        os.close(write)
        child = os.read(read, 100).decode()
        os.close(read)
        os.waitpid(pid, 0)
        assert child != parent
        assert address(held) == parent


def test_close_of_the_client_disconnects_it(server: RedisServer) -> None:
    with server.client() as admin:
        client = server.client()
        held = HeldConnection(client)
        held_id = address(held)
        assert held_id in last_commands(admin)
        client.close()
        deadline = time.monotonic() + 5  # the server notices a closed socket on its next turn
        while held_id in last_commands(admin) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held_id not in last_commands(admin)


def test_a_semaphore_sends_its_scripts_on_the_held_connection(server: RedisServer) -> None:
    with server.client() as client, server.client() as admin:
        sem = Semaphore(client, "held", 2)
        permit = granted(sem.attempt("a"))
        held = library_of(client).held(client)
        assert held is not None
        ours = address(held)
        permit.release()
        assert last_commands(admin)[ours] == "fcall"  # the release went out on it
        assert library_of(client).held(client.pipeline()) is None
        assert not holds(client.pipeline())


def test_a_pool_of_redis_py_before_5_3_is_asked_with_a_command_name() -> None:
    """redis-py 5.0-5.2's ``get_connection`` requires the command's name; 5.3 and
    later deprecate passing it (a warning, an error under this suite's filters)."""

    class Before53:
        def get_connection(self, command_name: str, *keys: Any, **options: Any) -> str:
            return f"lent for {command_name}"

    class Since53:
        def get_connection(self, command_name: str | None = None, *keys: Any) -> str:
            assert command_name is None, "passing a command name is deprecated"
            return "lent"

    assert _lend(Before53()) == "lent for FCALL"
    assert _lend(Since53()) == "lent"


def test_threads_that_find_a_new_process_at_once_share_one_new_connection(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The threads of a forked child (or a first call, before this was fixed) that
    all find the connection is not their process's: one makes the child's own, and
    each call gets its own reply. ``os.getpid`` made slow widens the window."""
    real_getpid = os.getpid

    def slow_getpid() -> int:
        time.sleep(0.002)
        return real_getpid()

    wrong: list[tuple[bytes, Any]] = []

    def ask(held: HeldConnection, start: threading.Barrier, text: bytes) -> None:
        start.wait()
        for _ in range(3):
            reply = held.call("ECHO", text)
            if reply is not BUSY and reply != text:
                wrong.append((text, reply))

    for trial in range(10):
        with server.client() as client:
            held, start = HeldConnection(client), threading.Barrier(8)
            held._pid = -1  # made in another process
            threads = [
                threading.Thread(target=ask, args=(held, start, f"{trial}-{i}".encode()))
                for i in range(8)
            ]
            monkeypatch.setattr(os, "getpid", slow_getpid)
            try:
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(10)
            finally:
                monkeypatch.setattr(os, "getpid", real_getpid)
            assert len(client.connection_pool._in_use_connections) == 1  # none taken and lost
    assert not wrong


def test_only_a_client_that_owns_an_ample_pool_holds_a_connection(server: RedisServer) -> None:
    shared = redis.ConnectionPool(host="127.0.0.1", port=server.port)
    made = [
        redis.Redis(host="127.0.0.1", port=server.port),
        redis.Redis.from_url(f"redis://127.0.0.1:{server.port}/0"),
        redis.Redis(connection_pool=shared),
        redis.Redis(host="127.0.0.1", port=server.port, max_connections=1),
        redis.Redis(
            connection_pool=redis.BlockingConnectionPool(host="127.0.0.1", port=server.port)
        ),
        redis.Redis(host="127.0.0.1", port=server.port, single_connection_client=True),
    ]
    try:
        assert [holds(client) for client in made] == [True, True, False, False, False, False]
        small = made[3]  # one connection in all: a semaphore still leaves it to the others
        granted(Semaphore(small, "small", 2).attempt("a")).release()
        small.set("other", "command")
        assert small.get("other") == b"command"
    finally:
        for client in made:
            client.close()
        shared.disconnect()


def test_a_connection_marked_for_reconnecting_is_not_used_again(server: RedisServer) -> None:
    with server.client() as client:
        held = HeldConnection(client)
        before = address(held)
        connection: Any = held._connection
        if not hasattr(connection, "mark_for_reconnect"):
            pytest.skip("redis-py before maintenance notices")
        connection.mark_for_reconnect()  # what a MOVING notice does to the pool's connections
        assert address(held) != before


def test_scripts_flushed_from_redis_are_loaded_again_on_the_held_connection(
    server: RedisServer,
) -> None:
    with server.client() as client:
        library_of(client)  # registered
        sem = Semaphore(client, "flushed", 2)
        library_of(client).way = "scripts"
        granted(sem.attempt("a")).release()
        client.script_flush()
        granted(sem.attempt("b")).release()
        assert library_of(client).way == "scripts"
        assert client.info("commandstats")["cmdstat_evalsha"]["calls"] >= 3
