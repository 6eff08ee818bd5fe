"""Where a waiting task's message may be parked: only where it is at least as safe
as in the broker.

On RabbitMQ (an AMQP broker), and on a Redis broker whose server is not the
semaphores' Redis, a parked task's message never leaves the broker: it waits in
a parking queue (`celery_semaphore.parking_queues`), whatever the semaphores'
store keeps (`Where.BROKER`). Where the semaphores' Redis is the broker's own
server (same host and port, or the same unix socket; the database may differ),
parking takes a task's message out of the broker's queue and keeps it beside its
place in line, in that Redis, until its turn (`Where.STORE`): a loss there takes
the broker's messages too, so parking changes nothing.

On any other broker (kombu's other transports, SQS) a task parks in the
semaphores' Redis (at the worker, `celery_semaphore.retry.Waits`, or at publish,
`celery_semaphore.publish.ParkingProducer`) only when it persists every write
(``appendonly yes``, read with ``CONFIG GET`` or ``INFO`` and re-read every
`RECHECK_EVERY` s; on Redis Cluster, on every primary). The opt-in to park in a
Redis that persists nothing, ``semaphore_park_without_persistence``, is retired:
ignored, with one WARNING (`celery_semaphore.config.RETIRED`).

Otherwise the task waits as a countdown retry, its message in the broker, and
the process logs one WARNING per Redis URL saying so (the worker at start,
before its pool forks, so its children do not say it again). What a process has
read (a Redis's persistence, and whether it is the broker's server: each for
`RECHECK_EVERY` s) is kept per app (``state_of(app).parking``), so
`celery_semaphore.reset()` forgets it.

With the semaphores in PostgreSQL the broker's parking queues come first as well
(RabbitMQ, a Redis broker: PostgreSQL is never the broker's server); on any other
broker a task's message parks in PostgreSQL, beside its place in line: a parked
message there is as safe as its WAL, so parking is always allowed there (nothing is
read, nothing is warned about).

A loss of the broker itself is the broker's business: what it keeps (a Redis
broker with or without AOF, RabbitMQ durable queues) is what waiting tasks keep.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .core.errors import SemaphoreConnectionError
from .core.postgres.connection import is_postgres_url
from .core.results import Persistence
from .core.urls import mask_url

if TYPE_CHECKING:
    from .config import SemaphoreConfig
    from .core.operations import OperatedStore

logger = logging.getLogger(__name__)

RECHECK_EVERY = 60.0
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})
SOCKET_SCHEMES = ("unix", "redis+socket", "socket")
TCP_SCHEMES = ("redis", "rediss")


class Where(Enum):
    """Where a waiting task's message parks."""

    BROKER = "in a parking queue of the broker"
    STORE = "in the semaphores' {store}"

    def in_words(self, store: str) -> str:
        """Where, for an operator; ``store``: the store's kind (Redis, PostgreSQL)."""
        return self.value.format(store=store)


def server_of(url: str) -> tuple[str, ...] | None:
    """The server a single-server Redis URL names: ``("unix", path)`` or ``("tcp",
    host, port)`` (loopback names as one); None for anything else (Cluster,
    Sentinel, another broker, a URL that does not parse)."""
    scheme = url.partition("://")[0].lower()
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if scheme in SOCKET_SCHEMES:
        return ("unix", os.path.realpath(parts.path)) if parts.path else None
    if scheme in TCP_SCHEMES:
        host = (parts.hostname or "localhost").lower()
        return ("tcp", "localhost" if host in LOOPBACK else host, str(port or 6379))
    return None


def broker_urls(app: Any) -> list[str]:
    """Every URL the app's broker messages may live at: the read and write URLs
    (both the broker URL unless set), each possibly a ``;``-separated or a list
    of failover URLs."""
    urls: list[str] = []
    for value in (app.conf.broker_write_url, app.conf.broker_read_url):
        items = value.split(";") if isinstance(value, str) else value or []
        urls.extend(item.strip() for item in items if isinstance(item, str) and item.strip())
    return urls


def is_the_brokers_server(app: Any, redis_url: str) -> bool:
    """Whether ``redis_url`` is the server every broker URL of ``app`` names."""
    server = server_of(redis_url)
    urls = broker_urls(app)
    return server is not None and bool(urls) and all(server_of(url) == server for url in urls)


class ParkingSafety:
    """What a process knows of the Redis its app's tasks would park in: each URL's
    persistence (re-read every ``recheck`` s) and the URLs already warned about.
    One per app (`celery_semaphore.state.AppState.parking`)."""

    def __init__(
        self, recheck: float = RECHECK_EVERY, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.recheck = recheck
        self.clock = clock
        self._lock = threading.Lock()
        self._readings: dict[str, tuple[float, Persistence]] = {}
        # Whether each URL is the broker's server, kept as long as a reading: the
        # broker's URLs are read from the app's settings, which are slow to read on
        # every publish.
        self._brokers: dict[str, tuple[float, bool]] = {}
        self._warned: set[str] = set()
        self._driver: str | None = None

    def broker_driver(self, app: Any) -> str:
        """The kind of the app's broker: ``"amqp"`` (RabbitMQ), ``"redis"``, or another
        of kombu's transports."""
        if self._driver is None:
            try:
                self._driver = str(app.connection_for_write().transport.driver_type)
            except Exception:  # an unknown transport: not one to park in
                self._driver = ""
        return self._driver

    def broker_is_amqp(self, app: Any) -> bool:
        """Whether the app's broker speaks AMQP (RabbitMQ): a higher priority goes first
        there (`celery_semaphore.gates.urgency`)."""
        return self.broker_driver(app) == "amqp"

    def in_broker(self, app: Any, config: SemaphoreConfig) -> bool:
        """Whether tasks with settings ``config`` park in the broker's parking queues:
        on RabbitMQ, and on a Redis broker that is not ``config.redis_url``'s server
        (asks nothing of either server; a PostgreSQL store is never the broker's)."""
        driver = self.broker_driver(app)
        return driver == "amqp" or (
            driver == "redis" and not self._is_the_brokers(app, config.redis_url)
        )

    def where(self, app: Any, config: SemaphoreConfig, store: OperatedStore) -> Where | None:
        """Where a task with settings ``config`` parks: in the broker (RabbitMQ, or a
        Redis broker that is not ``config.redis_url``'s server); else in the store at
        ``config.redis_url`` if it is PostgreSQL, the broker's own Redis server, or a
        Redis whose ``persistence()`` (read from ``store``) says it keeps every write;
        else nowhere (None: it waits as a countdown retry; logs the WARNING once per
        URL)."""
        if self.in_broker(app, config):
            return Where.BROKER
        if is_postgres_url(config.redis_url) or self._is_the_brokers(app, config.redis_url):
            return Where.STORE
        persistence = self.persistence(store, config.redis_url)
        if persistence is None:
            return None  # unreachable now: parking would fail as well
        if persistence.every_write:
            return Where.STORE
        self._warn(config.redis_url, persistence)
        return None

    def _is_the_brokers(self, app: Any, url: str) -> bool:
        now = self.clock()
        cached = self._brokers.get(url)
        if cached is not None and now - cached[0] < self.recheck:
            return cached[1]
        answer = is_the_brokers_server(app, url)
        self._brokers[url] = (now, answer)
        return answer

    def persistence(self, store: OperatedStore, url: str) -> Persistence | None:
        """The cached reading of ``url``'s persistence, read again when older than
        ``recheck``; None when the Redis cannot be reached (nothing cached)."""
        now = self.clock()
        cached = self._readings.get(url)
        if cached is not None and now - cached[0] < self.recheck:
            return cached[1]
        try:
            persistence = store.persistence()
        except SemaphoreConnectionError:
            return None
        with self._lock:
            self._readings[url] = (now, persistence)
        return persistence

    def _warn(self, url: str, persistence: Persistence) -> None:
        with self._lock:
            if url in self._warned:
                return
            self._warned.add(url)
        if persistence.every_write is None:
            why = (
                f"whether it persists is unknown ({persistence.detail}; managed Redis "
                "services often disable CONFIG)"
            )
            fixes = (
                "Set appendonly yes on that Redis and let this Redis user run CONFIG GET or "
                "INFO, so that the check can see it"
            )
        else:
            why = (
                f"it does not write every change to disk ({persistence.detail}): a restart "
                "would lose the tasks parked there"
            )
            fixes = "Set appendonly yes on that Redis to let tasks park there"
        logger.warning(
            "celery-semaphore: waiting tasks do not park in the Redis at %s: it is not the "
            "broker's server and %s. They wait as countdown retries instead, their messages "
            "in the broker. %s",
            mask_url(url),
            why,
            fixes,
        )
