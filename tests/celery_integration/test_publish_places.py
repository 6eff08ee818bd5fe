"""Places in line taken at publish, when the process has several apps (Celery shares
tasks between apps, so more than one may know the published task's name)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

import celery_semaphore
import celery_semaphore.publish
from celery_semaphore import Semaphore
from celery_semaphore.state import installed_apps


@pytest.fixture
def apps(redis_url: str) -> Iterator[list[Celery]]:
    made: list[Celery] = []
    yield made
    for app in made:
        installed_apps.discard(app)
        celery_semaphore.reset(app)
        app.close()


def make(apps: list[Celery], redis_url: str, **conf: Any) -> Celery:
    app = Celery(f"places{len(apps)}", broker="memory://", set_as_current=False)
    app.conf.update(semaphore_redis_url=redis_url, **conf)
    celery_semaphore.install(app)
    app.finalize()
    apps.append(app)
    return app


def test_the_app_whose_settings_give_gates_takes_the_place(
    apps: list[Celery], redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = make(apps, redis_url)  # knows the task too, but caps no queue
    capping = make(apps, redis_url, semaphore_queue_limits={"reports": 1})
    for app in (other, capping):

        @app.task(name="proj.report", shared=False)
        def report() -> None: ...

    # The registry is a set: make the order the worst one, the other app first.
    monkeypatch.setattr(celery_semaphore.publish, "installed_apps", [other, capping])
    sent = capping.tasks["proj.report"].apply_async(queue="reports")
    sem = Semaphore(redis_url, "queue:reports", 1)
    assert [w.holder for w in sem.status().waiters] == [sent.id]
    sem.close()
