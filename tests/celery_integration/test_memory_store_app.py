"""An app's tests with no server at all: the broker is kombu's ``memory://``, the
semaphores are in the memory store (``semaphore_redis_url = "memory://"``), and the
worker runs in a thread of the test process (Celery's ``start_worker``, what the
``celery_worker`` fixture uses), so both share one process's memory."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_semaphore import LimitedTask
from celery_semaphore.state import state_of


@pytest.fixture
def app() -> Celery:
    app = Celery("no-server", set_as_current=False)
    app.conf.update(
        broker_url="memory://",
        result_backend="cache+memory://",
        semaphore_redis_url="memory://",
        semaphore_heartbeat_interval=0.5,
    )
    return app


def test_the_cap_holds_on_the_memory_store_with_no_server(app: Celery) -> None:
    lock, running, most = threading.Lock(), [0], [0]

    @app.task(base=LimitedTask, semaphore="partner-api", limit=2, shared=False)
    def call_partner(order_id: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.1)
        with lock:
            running[0] -= 1
        return order_id

    with start_worker(app, pool="threads", concurrency=4, perform_ping_check=False,
                      loglevel="WARNING", shutdown_timeout=30):  # fmt: skip
        results = [call_partner.delay(n) for n in range(8)]
        assert [r.get(timeout=60) for r in results] == list(range(8))
    assert most[0] == 2, "never more than the limit at once, and the limit reached"
    store = state_of(app).semaphores.store("memory://")
    status = store.counts("celery_semaphore", ["partner-api"])
    assert [(c.holder_count, c.waiter_count) for c in status] == [(0, 0)]


def test_the_cli_and_the_metrics_read_the_memory_store(app: Any) -> None:
    """The operators' side answers from the models: names, counts, a wake-up heard."""
    store = state_of(app).semaphores.store("memory://")
    watching = store.watch("celery_semaphore")
    assert store.wake_workers("celery_semaphore", "partner-api") == 1
    assert watching.heard() and not watching.heard()
    assert store.persistence().every_write is True
    assert store.last_data_loss("celery_semaphore") == (0.0, 0.0, 0.0)
