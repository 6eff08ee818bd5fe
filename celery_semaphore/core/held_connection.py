"""The connection a sync client keeps for this package's script calls.

redis-py 8 takes a connection from the pool and gives it back around every command
(a lock, a fork check, a ``can_read()`` poll of the socket, its observability
counters): on this project's machine about 65 µs of client CPU a call, as much as
the round trip's own. A worker makes two script calls per task (the permit taken
and given back), so the package sends its calls on one connection it takes from
the client's pool once and keeps:

- one per client and process: after a fork the child takes its own (the parent's
  socket is never used by two processes);
- used by one thread at a time: a thread that finds it busy sends its call the
  usual way (through the pool), so threads never wait for each other here;
- a call that fails on the connection (refused, reset, timed out, interrupted
  between sending and reading) disconnects it, and the next call connects again;
  connection errors are retried as the client's own ``retry`` says, as redis-py
  does for its commands;
- the pool still owns it: ``client.close()`` disconnects it with the others.

Not used for pipelines, Redis Cluster clients, ``single_connection_client``
clients or asyncio clients: they take their usual path. Commands sent here are
not seen by redis-py's own observability (its OpenTelemetry metrics).
"""

from __future__ import annotations

import inspect
import os
import threading
from typing import Any

import redis
import redis.client

#: What `HeldConnection.call` returns when another thread of this process holds the
#: connection: the caller sends the command the usual way.
BUSY = object()


def _lend(pool: Any) -> Any:
    """A connection of ``pool``, which it counts as in use until it is closed. (Its
    ``get_connection`` needs a command name before redis-py 5.3, which deprecates it.)"""
    parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    if parameter is not None and parameter.default is inspect.Parameter.empty:
        return pool.get_connection("FCALL")
    return pool.get_connection()


def holds(client: Any) -> bool:
    """Whether calls on ``client`` may go through a `HeldConnection`."""
    return (
        isinstance(client, redis.Redis)
        and not isinstance(client, redis.client.Pipeline)
        and client.connection is None
    )


class HeldConnection:
    """One connection of ``client``'s pool, kept for this package's script calls."""

    def __init__(self, client: redis.Redis) -> None:
        #: The client's id: calls made on anything else (its pipelines) are not its.
        self.client_id = id(client)
        self._pool = client.connection_pool
        self._pid = -1
        self._lock = threading.Lock()
        self._connection: Any = None

    def call(self, *command: Any) -> Any:
        """Send ``command`` and return Redis' raw reply (an error reply raises as
        redis-py's ``ResponseError``), or `BUSY`."""
        if self._pid != os.getpid():
            self._lock, self._connection, self._pid = threading.Lock(), None, os.getpid()
        lock = self._lock
        if not lock.acquire(blocking=False):
            return BUSY
        try:
            connection = self._connection
            if connection is None:
                connection = self._connection = _lend(self._pool)
            return connection.retry.call_with_retry(
                lambda: self._send(connection, command), lambda _: connection.disconnect()
            )
        finally:
            lock.release()

    def _send(self, connection: Any, command: tuple[Any, ...]) -> Any:
        try:
            self._ready(connection)
            connection.send_command(*command)
            reply = connection.read_response()
        except redis.ResponseError:
            raise  # the connection is fine: the reply was read whole
        except BaseException:
            connection.disconnect()  # a reply may be left unread: never reuse the socket
            raise
        if getattr(connection, "should_reconnect", bool)():  # redis-py 8: a maintenance notice
            connection.disconnect()
        return reply

    def _ready(self, connection: Any) -> None:
        """The pool's own check before it lends a connection: connected (a Sentinel
        connection asks for the master here), and nothing waiting to be read (a
        socket the server closed while it sat idle reads as ready: it is connected
        again, as the pool would)."""
        connection.connect()
        pool = self._pool
        expects_data = (
            getattr(pool, "cache", None) is not None
            or getattr(pool, "maint_notifications_enabled", bool)()
        )
        try:
            if connection.can_read() and not expects_data:
                raise redis.ConnectionError("Connection has data")
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            connection.disconnect()
            connection.connect()
            if connection.can_read() and not expects_data:
                raise redis.ConnectionError("Connection not ready") from None
