"""Helpers for the worker tests of task options, waiting, queue caps, Flower, brokers/canvas.

:func:`point_client_at` gives the test process's ``limited_app`` (imported
once per session) exactly the settings of the new cluster: besides what the
harness resets (its connections, and the settings earlier clusters' ``extra_conf``
left), it drops the per-task cached semaphore settings and sets the cluster's
lease and queue limits (used when places are taken at publish).

:class:`TaskEvents` records the workers' Celery events (workers run with
``-E``), which is how Flower and other monitors see ``request.retries``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from datetime import datetime
from typing import Any

from celery_harness import Cluster, detach_client, drop_extra_settings

import celery_semaphore


def close_client_connections(app: Any) -> None:
    """Drop the app's broker pool, result backend and cached settings."""
    detach_client(app)


def point_client_at(cluster: Cluster) -> Cluster:
    """Make the test process's ``limited_app`` publish to, and read from, ``cluster`` only,
    with this cluster's settings only (the harness keeps the earlier clusters' queue
    limits and lease)."""
    app = cluster.app_module.app
    close_client_connections(app)
    drop_extra_settings(app)
    app.conf.update(
        {
            "broker_url": cluster.broker_url,
            "result_backend": cluster.state_url,
            "semaphore_redis_url": cluster.state_url,
            "semaphore_lease_timeout": cluster.lease,
            "semaphore_queue_limits": json.loads(cluster.env["CS_QUEUE_LIMITS"]),
            "task_default_queue": "default",
            **cluster.app_module.extra_conf(cluster.env["CS_EXTRA_CONF"]),
        }
    )
    celery_semaphore.reset(app)
    return cluster


class TaskEvents:
    """Every event the workers send, collected by a receiver thread in the test process."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._connection = app.connection_for_read()
        self._receiver = app.events.Receiver(self._connection, handlers={"*": self._on_event})
        self._thread = threading.Thread(target=self._run, name="test-events", daemon=True)
        self.error: BaseException | None = None

    def _on_event(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(event)

    def _run(self) -> None:
        while not self._receiver.should_stop:
            try:
                self._receiver.capture(limit=None, timeout=None, wakeup=False)
            except ValueError as error:
                # kombu's filesystem transport rewrites its exchange table in place: a
                # read while a worker declares sees "" (a JSON error); listen on
                self.error = error
                time.sleep(0.05)
            except BaseException as error:  # reported by stop()
                if not self._receiver.should_stop:
                    self.error = error
                return

    def start(self, timeout: float = 10.0) -> TaskEvents:
        """Start listening; returns once an event sent now is seen (so none is missed later)."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        with self.app.events.default_dispatcher() as dispatcher:
            while not any(e["type"] == "test-ping" for e in self.snapshot()):
                if time.monotonic() > deadline:
                    raise AssertionError(f"event receiver not live: {self.error!r}")
                try:
                    dispatcher.send("test-ping")
                except ValueError as error:
                    # kombu's filesystem transport rewrites its exchange table in place:
                    # a publish that reads it while a worker declares sees "" (JSON error)
                    self.error = error
                time.sleep(0.2)
        return self

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    def of(self, task_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.snapshot()
            if e.get("uuid") == task_id and (kind is None or e["type"] == kind)
        ]

    def received_retries(self, task_id: str) -> list[int]:
        """``request.retries`` of each delivery of the task, as monitors see it."""
        return [int(e["retries"]) for e in self.of(task_id, "task-received")]

    def stop(self) -> None:
        self._receiver.should_stop = True
        self._thread.join(10)
        self._connection.release()


def intervals(events: list[dict[str, Any]], task_ids: set[str]) -> list[tuple[float, float]]:
    """(start, end) of each body run of the given tasks, from the harness's event records."""
    starts: dict[str, list[float]] = {}
    runs = []
    for e in sorted(events, key=lambda e: e["at"]):
        if e["id"] not in task_ids:
            continue
        if e["event"] == "start":
            starts.setdefault(e["id"], []).append(e["at"])
        elif e["event"] == "end" and starts.get(e["id"]):
            runs.append((starts[e["id"]].pop(0), e["at"]))
    return runs


class Clusters:
    """What a test's ``clusters`` fixture hands out: clusters the client is pointed at,
    and event receivers on them; ``close()`` stops the receivers and drops the
    client's connections (before the harness stops the workers and Redis)."""

    def __init__(self, factory: Any) -> None:
        self._factory = factory
        self._apps: list[Any] = []
        self._receivers: list[TaskEvents] = []

    def __call__(self, **kwargs: Any) -> Cluster:
        cluster = point_client_at(self._factory(**kwargs))
        self._apps.append(cluster.app_module.app)
        return cluster

    def events(self, cluster: Cluster) -> TaskEvents:
        """Receiver of the workers' events (start workers with ``extra=["-E"]``)."""
        receiver = TaskEvents(cluster.app_module.app).start()
        self._receivers.append(receiver)
        return receiver

    def close(self) -> None:
        for receiver in self._receivers:
            receiver.stop()
        for app in self._apps:
            close_client_connections(app)

    def __enter__(self) -> Clusters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def eta_countdowns(receiver: TaskEvents, task_id: str) -> list[float]:
    """For each delivery with an ETA: seconds from its receipt to its ETA."""
    out = []
    for event in receiver.of(task_id, "task-received"):
        if event.get("eta"):
            eta = datetime.fromisoformat(event["eta"]).timestamp()
            out.append(eta - float(event["timestamp"]))
    return out


def rabbitmqctl(*args: str) -> bool:
    """Run ``rabbitmqctl`` with ``args`` (the machine's RabbitMQ); whether it succeeded."""
    command = shutil.which("rabbitmqctl")
    if command is None:
        return False
    done = subprocess.run([command, *args], capture_output=True, timeout=60, check=False)
    return done.returncode == 0
