"""The connection a client keeps for the package's script calls (held_connection.py),
on a real redis-server: the reply a call gets is its own, whatever happened to the
connection before (a restart, an interrupted call, a fork, another thread)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_semaphore import Semaphore
from celery_semaphore.core.held_connection import BUSY, HeldConnection, _lend, holds
from celery_semaphore.core.scripts import library_of
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
        assert held_id not in last_commands(admin)


def test_a_semaphore_sends_its_scripts_on_the_held_connection(server: RedisServer) -> None:
    with server.client() as client, server.client() as admin:
        sem = Semaphore(client, "held", 2)
        permit = sem.attempt("a")
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
