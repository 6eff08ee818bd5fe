"""Which semaphores a task request must pass ("gates"), and the per-process clients.

A request passes at most two gates, always in this order: the cap of the queue
it was consumed from (``semaphore_queue_limits``), then its task's own
semaphore (:class:`~celery_semaphore.LimitedTask`). The worker's main process
computes them when the message arrives and stores them in the request's
headers (:data:`GATES_HEADER`), so the child, the heartbeat and the
release-by-id paths all agree on the same names.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from . import validation
from .config import SemaphoreConfig
from .connection import SyncClient, connect, mask_url
from .semaphore import Semaphore

GATES_HEADER = "celery_semaphore_gates"
WAIT_HEADER = "celery_semaphore"
QUEUE_PREFIX = "queue:"
QUICK_TIMEOUT = 0.25


@dataclass(frozen=True)
class Gate:
    name: str
    limit: int

    def encode(self) -> list[Any]:
        return [self.name, self.limit]

    @classmethod
    def decode(cls, raw: Any) -> Gate:
        name, limit = raw
        return cls(str(name), int(limit))


def queue_gate(queue: str | None, config: SemaphoreConfig) -> Gate | None:
    if queue is None or queue not in config.queue_limits:
        return None
    return Gate(QUEUE_PREFIX + queue, config.queue_limits[queue])


def task_gate(task: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Gate | None:
    """The task's own gate (None for a task that has no ``semaphore`` option)."""
    # A key function is stored as a class attribute: looked up on the task it
    # would become a bound method and receive the task as its first argument.
    spec: Any = inspect.getattr_static(task, "semaphore", None)
    if isinstance(spec, staticmethod):
        spec = spec.__func__
    if spec is None:
        return None
    if callable(spec):
        try:
            name = spec(*args, **kwargs)
        except Exception as error:
            raise ValueError(
                f"task {task.name}: the semaphore key function {spec!r} failed on this "
                f"task's arguments: {error!r}"
            ) from error
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"task {task.name}: the semaphore key function must return a non-empty str, "
                f"got {name!r}"
            )
    else:
        name = spec
    return Gate(validation.check_name(name, f"task {task.name}: semaphore"), task.limit)


def encode_gates(gates: Sequence[Gate]) -> list[list[Any]]:
    return [g.encode() for g in gates]


def decode_gates(raw: Any) -> list[Gate]:
    if not raw:
        return []
    return [Gate.decode(item) for item in raw]


def _client(url: str, quick: bool) -> SyncClient:
    if quick and url.startswith(("redis://", "rediss://", "unix://")):
        return redis.Redis.from_url(
            url, socket_timeout=QUICK_TIMEOUT, socket_connect_timeout=QUICK_TIMEOUT,
            retry=Retry(NoBackoff(), 0),
        )  # fmt: skip
    return connect(url)[0]


class Semaphores:
    """One client per Redis URL and one :class:`Semaphore` per gate, per process.

    redis-py connection pools notice a fork and reconnect in the child.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, bool], SyncClient] = {}
        self._semaphores: dict[tuple[Any, ...], Semaphore] = {}

    def get(self, gate: Gate, config: SemaphoreConfig, *, quick: bool = False) -> Semaphore:
        """The gate's semaphore; ``quick``: on a client that gives up within
        :data:`QUICK_TIMEOUT` s, for callers that must never stall (publishing)."""
        key = (config.redis_url, config.namespace, gate.name, gate.limit, config.lease_timeout,
               quick)  # fmt: skip
        semaphore = self._semaphores.get(key)
        if semaphore is None:
            with self._lock:
                client = self._clients.get((config.redis_url, quick))
                if client is None:
                    client = self._clients[(config.redis_url, quick)] = _client(
                        config.redis_url, quick
                    )
                semaphore = Semaphore(
                    client,
                    gate.name,
                    gate.limit,
                    lease_timeout=config.lease_timeout,
                    namespace=config.namespace,
                )
                semaphore.url = mask_url(config.redis_url)
                self._semaphores[key] = semaphore
        return semaphore


semaphores = Semaphores()
