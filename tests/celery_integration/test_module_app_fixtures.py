"""A project's own module-level app (celery_apps/reports_app.py, a ``proj/celery.py``)
tested with its routes and queue caps under Celery's pytest fixtures, with no server:
the tests point the app at kombu's ``memory://`` broker and the memory store, and the
worker (in a thread of this process) consumes the routed queue.
docs/getting-started.md, "Testing your own tasks", shows this recipe."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery, current_task
from celery_apps import reports_app

import celery_semaphore
from celery_semaphore.state import installed_apps

NO_SERVER = {
    "broker_url": "memory://",
    "result_backend": "cache+memory://",
    "semaphore_redis_url": "memory://",
    "broker_transport_options": {"polling_interval": 0.05},
}


@pytest.fixture
def celery_app() -> Iterator[Celery]:
    """The project's app, not the new one Celery's fixture makes."""
    app = reports_app.app
    app.conf.update(NO_SERVER)
    celery_semaphore.reset(app)  # in case the plugin read the production settings
    yield app
    celery_semaphore.reset(app)


@pytest.fixture(autouse=True)
def _installed_only_in_this_module() -> Iterator[None]:
    """This suite's process also holds its other apps, and Celery gives every app the
    tasks of the others (shared tasks): left installed, this app would be asked to take
    places at publish for the other tests' tasks (conftest.py drops the apps no module
    holds; this one stays in sys.modules)."""
    celery_semaphore.install(reports_app.app)
    yield
    installed_apps.discard(reports_app.app)


@pytest.fixture(scope="session")
def celery_worker_pool() -> str:
    return "threads"


@pytest.fixture(scope="session")
def celery_worker_parameters() -> dict[str, Any]:
    return {
        "concurrency": 4,
        "queues": ["celery", "reports"],  # celery worker -Q celery,reports
        "perform_ping_check": False,
        "loglevel": "WARNING",
    }


class Overlap:
    """Stands in for the warehouse: how many calls of each task ran at once, and the
    queues their messages came from."""

    def __init__(self, query: Callable[[int], list[int]]) -> None:
        self.query, self.lock = query, threading.Lock()
        self.now: dict[str, int] = defaultdict(int)
        self.most: dict[str, int] = defaultdict(int)
        self.queues: dict[str, set[str]] = defaultdict(set)

    def __call__(self, report_id: int) -> list[int]:
        task = current_task.name
        with self.lock:
            self.now[task] += 1
            self.most[task] = max(self.most[task], self.now[task])
            # a task that waited for its permit comes back on <queue>.semaphore-handover
            queue = current_task.request.delivery_info["routing_key"]
            self.queues[task].add(queue.removesuffix(".semaphore-handover"))
        try:
            return self.query(report_id)
        finally:
            with self.lock:
                self.now[task] -= 1


@pytest.fixture
def overlap(monkeypatch: pytest.MonkeyPatch) -> Overlap:
    seen = Overlap(reports_app.query_warehouse)
    monkeypatch.setattr(reports_app, "query_warehouse", seen)
    return seen


def test_the_routed_queue_cap_holds(
    celery_app: Celery, celery_worker: Any, overlap: Overlap
) -> None:
    reports = [reports_app.build_report.delay(n) for n in range(6)]
    assert [r.get(timeout=30) for r in reports] == list(range(6))
    exports = [reports_app.export_rows.delay(n) for n in range(6)]
    assert [r.get(timeout=30) for r in exports] == list(range(6))
    # build_report is routed to "reports", capped at 1; export_rows goes to the default
    # queue, where the limit of 2 they share is the only cap
    assert overlap.queues == {
        "reports_app.build_report": {"reports"},
        "reports_app.export_rows": {"celery"},
    }
    assert overlap.most == {"reports_app.build_report": 1, "reports_app.export_rows": 2}
