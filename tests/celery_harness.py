"""Real ``celery worker`` subprocesses for the worker tests (see celery_apps/limited_app.py).

A :class:`Cluster` owns a private broker/result/semaphore Redis (the test's own
``redis-server``), starts workers as separate processes, and observes them from
outside: the ``events`` list the task bodies write and the semaphores' state.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

import celery_semaphore
from celery_semaphore import Semaphore
from devkit.measures import peak_of_records
from devkit.processes import Child, wait_until, worker_command

APPS = Path(__file__).parent / "celery_apps"


# What limited_app sets at import; any other changed setting came from a test's extra_conf.
BASE_SETTINGS = {
    "broker_connection_retry_on_startup",
    "broker_url",
    "deprecated_settings",
    "result_backend",
    "result_expires",
    "semaphore_lease_timeout",
    "semaphore_queue_limits",
    "semaphore_redis_url",
    "task_default_queue",
    "worker_hijack_root_logger",
}


def drop_extra_settings(app: Any) -> None:
    """Forget the settings an earlier cluster's ``extra_conf`` left in the test
    process's ``limited_app`` (a ``semaphore_namespace`` left behind has the next
    test publish its places into another namespace than its workers read)."""
    app.conf.get("broker_url")  # the changes are a lazy view until a setting is read
    for key in list(app.conf.changes):
        if key not in BASE_SETTINGS:
            del app.conf[key]


def repoint_client(cluster: Cluster) -> None:
    """Point the test process's app at this test's Redis.

    The harness imports limited_app once per session and then only updates
    ``broker_url`` / ``result_backend`` in its conf, but the app caches its
    broker pool, its result backend and its semaphore settings: a second test
    in the session would publish to, and read results from, the previous
    test's stopped server.
    """
    app = cluster.app_module.app
    detach_client(app)
    app.conf.semaphore_redis_url = cluster.state_url


def forget_result_subscriptions(backend: Any) -> None:
    """Forget the result channels a Redis result backend subscribed to (see
    detach_client). Each thread that publishes has a backend of its own."""
    consumer = getattr(backend, "result_consumer", None)
    if consumer is not None:
        consumer.subscribed_to.clear()
        consumer._pending_unsubscribe.clear()
        with contextlib.suppress(Exception):
            consumer.stop()
        consumer._pubsub = None


def forget_closed_pools() -> None:
    """kombu keeps one pool per broker address for the whole process
    (``kombu.pools.connections`` and ``producers``): a pool closed by a test stays
    there and is handed to a later test whose server got the same port
    ("Acquire on closed pool"). Forget the closed ones."""
    from kombu import pools

    for group in (pools.connections, pools.producers):
        for key, pool in list(group.items()):
            inner = getattr(pool, "connections", None)  # a ProducerPool's ConnectionPool
            if getattr(pool, "_closed", False) or getattr(inner, "_closed", False):
                group.pop(key, None)


def detach_client(app: Any) -> None:
    """Drop the app's broker pool, result backend and semaphore settings.

    The result backend's subscriptions are forgotten first: the Redis backend
    subscribes to each task's result channel when it is sent and unsubscribes
    in ``AsyncResult.__del__``, which, once the test's server is gone, retries
    for 20 s and raises (an error under pytest).
    """
    backend = app._backend
    forget_result_subscriptions(backend)
    if backend is not None:
        backend.client.connection_pool.disconnect()
    app._backend_cache = None
    app._local.__dict__.pop("backend", None)
    pool, app._pool = app._pool, None
    if pool is not None:
        pool.force_close_all()
    forget_closed_pools()
    app.amqp._producer_pool = None
    app.__dict__.pop("amqp", None)  # its queues and routes, made from the old settings
    celery_semaphore.reset(app)  # settings, clients and the publish pause of the old server


class Worker:
    """One ``celery worker`` process (and its pool children), seen from outside."""

    def __init__(
        self,
        *,
        env: dict[str, str],
        name: str,
        pool: str,
        concurrency: int,
        queues: str | None,
        log: Path,
        app: str,
        extra: list[str],
    ) -> None:
        self.name = name
        self.log = log
        command = worker_command(
            app, name, pool=pool, concurrency=concurrency, queues=queues, extra=extra
        )
        self.child = Child.start(name, command, log, env=env, cwd=APPS)
        self.process = self.child.process

    @property
    def pid(self) -> int:
        return self.child.pid

    def text(self) -> str:
        return self.child.text()

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            if not self.child.alive():
                raise AssertionError(f"worker {self.name} exited:\n{self.text()[-3000:]}")
            return " ready." in self.text()

        wait_until(ready, timeout, f"worker {self.name} ready")

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def signal(self, signum: int) -> None:
        self.child.signal(signum)

    def kill_all(self) -> None:
        """SIGKILL the worker and its children at once (a machine dying)."""
        self.child.kill_group()
        self.process.wait(10)

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.process.wait(timeout)

    def close(self) -> None:
        self.child.finish(time.monotonic())


class Cluster:
    """Workers sharing one private Redis (broker db 0, results and semaphores db 1)."""

    def __init__(
        self,
        redis_url: str,
        tmp: Path,
        *,
        broker_url: str | None = None,
        limit: int = 2,
        lease: float = 60.0,
        queue_limits: dict[str, int] | None = None,
        extra_conf: dict[str, Any] | None = None,
    ) -> None:
        base = redis_url.rsplit("/", 1)[0]
        self.state_url = f"{base}/1"
        self.broker_url = broker_url or f"{base}/0"
        self.limit = limit
        self.lease = lease
        self.tmp = tmp
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(APPS), os.environ.get("PYTHONPATH", "")]),
            "CS_BROKER_URL": self.broker_url,
            "CS_REDIS_URL": self.state_url,
            "CS_LIMIT": str(limit),
            "CS_LEASE": str(lease),
            "CS_QUEUE_LIMITS": json.dumps(queue_limits or {}),
            "CS_EXTRA_CONF": json.dumps(extra_conf or {}),
        }
        self.workers: list[Worker] = []
        self.redis = redis.Redis.from_url(self.state_url)
        self._semaphores: dict[tuple[str, int], Semaphore] = {}
        os.environ.update({k: v for k, v in self.env.items() if k.startswith("CS_")})
        sys.path.insert(0, str(APPS))
        import limited_app

        self.app_module = limited_app
        self._configure_client_app()

    def _configure_client_app(self) -> None:
        app = self.app_module.app
        drop_extra_settings(app)
        app.conf.broker_url = self.broker_url
        app.conf.result_backend = self.state_url
        self.app_module._log = redis.Redis.from_url(self.state_url)
        self.app_module.declare_limit(self.limit)
        app.conf.update(self.app_module.extra_conf(self.env["CS_EXTRA_CONF"]))
        repoint_client(self)

    def worker(
        self,
        name: str = "w1",
        *,
        pool: str = "prefork",
        concurrency: int = 2,
        queues: str | None = None,
        extra: list[str] | None = None,
        app: str = "limited_app",
        wait: bool = True,
    ) -> Worker:
        worker = Worker(
            env=self.env,
            name=name,
            pool=pool,
            concurrency=concurrency,
            queues=queues,
            log=self.tmp / f"{name}.log",
            app=app,
            extra=extra or [],
        )
        self.workers.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    def semaphore(self, name: str = "hold", limit: int | None = None) -> Semaphore:
        key = (name, limit or self.limit)
        if key not in self._semaphores:
            self._semaphores[key] = Semaphore(self.redis, name, key[1], lease_timeout=self.lease)
        return self._semaphores[key]

    def holders(self, name: str = "hold") -> int:
        return self.semaphore(name).status().holder_count

    def waiters(self, name: str = "hold") -> int:
        return self.semaphore(name).status().waiter_count

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(e) for e in self.redis.lrange("events", 0, -1)]

    def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        try:
            wait_until(predicate, timeout, what)
        except Exception as error:
            logs = "\n".join(f"--- {w.name}\n{w.text()[-4000:]}" for w in self.workers)
            raise AssertionError(f"{error}\n{logs}") from error

    def started(self, task_id: str) -> bool:
        return any(e["id"] == task_id and e["event"] == "start" for e in self.events())

    def close(self) -> None:
        detach_client(self.app_module.app)
        for worker in self.workers:
            worker.close()
        self.redis.close()
        for semaphore in self._semaphores.values():
            semaphore.close()
        sys.path.remove(str(APPS))


def max_overlap(events: list[dict[str, Any]]) -> int:
    """Most task bodies running at once, from their start/end records."""
    return peak_of_records(events)


def settle(seconds: float) -> None:
    time.sleep(seconds)
