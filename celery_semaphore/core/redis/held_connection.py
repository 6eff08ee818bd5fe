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
- before each call, what the pool does before it lends a connection: connected
  (a Sentinel connection asks for the master there), re-authenticated where a
  credential provider renewed its token, connected again where the server closed
  it while it sat idle or a maintenance notice moved it; then the call, retried on
  connection errors as the client's own ``retry`` says, as redis-py retries its
  commands; a call interrupted between sending and reading (a soft time limit)
  disconnects it, so no reply is ever read by the wrong call;
- only on a client that owns its pool (made from a URL or from host and port, not
  given a ``connection_pool``): closing the client, or its end, closes the
  connection with the pool; and only where the pool allows at least
  `MIN_POOL_SIZE` connections and does not block for one, so the connection kept
  never takes the last one another command needs.

Pipelines, Redis Cluster, ``single_connection_client`` and asyncio clients take
their usual path. Calls sent here are not seen by what watches redis-py's
``execute_command``: its own OpenTelemetry metrics, tracing that patches it.
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

#: A pool that allows fewer connections than this keeps them all for the client's
#: other commands.
MIN_POOL_SIZE = 32


class Setup:
    """The lock that guards making a client's held connection (functions.Library.held)
    and a child's own after a fork (`HeldConnection.call`). Made again in a forked
    child, where another thread may have held it at the fork."""

    lock = threading.Lock()

    @classmethod
    def renew(cls) -> None:
        cls.lock = threading.Lock()


os.register_at_fork(after_in_child=Setup.renew)


_PLAIN_CLIENT: dict[type, bool] = {}


def holds(client: Any) -> bool:
    """Whether calls on ``client`` may go through a `HeldConnection`."""
    kind = type(client)
    plain = _PLAIN_CLIENT.get(kind)
    if plain is None:  # redis.Redis is a Protocol's subclass: isinstance() is slow
        plain = issubclass(kind, redis.Redis) and not issubclass(kind, redis.client.Pipeline)
        _PLAIN_CLIENT[kind] = plain
    if not plain:
        return False
    pool = client.connection_pool
    return (
        client.connection is None
        and getattr(client, "auto_close_connection_pool", False)
        and not isinstance(pool, redis.BlockingConnectionPool)
        and getattr(pool, "max_connections", 0) >= MIN_POOL_SIZE
    )


def _lend(pool: Any) -> Any:
    """A connection of ``pool``, which it counts as in use until it is closed. (Its
    ``get_connection`` needs a command name before redis-py 5.3, which deprecates it.)"""
    parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    if parameter is not None and parameter.default is inspect.Parameter.empty:
        return pool.get_connection("FCALL")
    return pool.get_connection()


class HeldConnection:
    """One connection of ``client``'s pool, kept for this package's script calls."""

    def __init__(self, client: redis.Redis) -> None:
        #: The client's id: calls made on anything else (its pipelines) are not its.
        self.client_id = id(client)
        self._pool = client.connection_pool
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._connection: Any = None

    def call(self, *command: Any) -> Any:
        """Send ``command`` and return Redis' raw reply (an error reply raises as
        redis-py's ``ResponseError``), or `BUSY`."""
        if self._pid != os.getpid():
            self._after_fork()
        lock = self._lock
        if not lock.acquire(blocking=False):
            return BUSY
        try:
            connection = self._connection
            if connection is None:
                connection = self._connection = _lend(self._pool)
            self._ready(connection)
            return connection.retry.call_with_retry(
                lambda: self._send(connection, command), lambda _: connection.disconnect()
            )
        finally:
            lock.release()

    def _after_fork(self) -> None:
        """In a forked child: a lock and a connection of its own (the parent's socket
        stays the parent's: dropping the object here does not shut it down)."""
        with Setup.lock:
            if self._pid != os.getpid():
                self._lock, self._connection = threading.Lock(), None
                self._pid = os.getpid()

    def _ready(self, connection: Any) -> None:
        """What the pool does before it lends a connection (once per call, outside
        the retries, as there)."""
        try:
            if getattr(connection, "should_reconnect", bool)():  # redis-py 8: a maintenance notice
                connection.disconnect()
            connection.connect()  # a Sentinel connection finds the master here
            pool = self._pool
            expects_data = (
                getattr(pool, "cache", None) is not None
                or getattr(pool, "maint_notifications_enabled", bool)()
            )
            try:
                if connection.can_read() and not expects_data:
                    raise redis.ConnectionError("Connection has data")
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                connection.disconnect()  # the server closed it while it sat idle
                connection.connect()
                if connection.can_read() and not expects_data:
                    raise redis.ConnectionError("Connection not ready") from None
            re_auth = getattr(connection, "re_auth", None)  # redis-py 5.1+: a renewed token
            if re_auth is not None:
                re_auth()
        except BaseException:
            connection.disconnect()
            raise

    @staticmethod
    def _send(connection: Any, command: tuple[Any, ...]) -> Any:
        try:
            connection.send_command(*command)
            reply = connection.read_response()
        except redis.ResponseError:
            raise  # the connection is fine: the reply was read whole
        except BaseException:
            connection.disconnect()  # a reply may be left unread: never reuse the socket
            raise
        if getattr(connection, "should_reconnect", bool)():
            connection.disconnect()
        return reply
