"""The worker's heartbeat renews often enough for the shortest lease any task declares."""

from __future__ import annotations

from celery import Celery

from celery_semaphore import LimitedTask
from celery_semaphore.worker.heartbeat import renew_interval


def make_app(name: str) -> Celery:
    app = Celery(name, broker="memory://", set_as_current=False)
    app.conf.semaphore_lease_timeout = 60.0
    app.conf.semaphore_redis_url = "memory://"  # a broker that is not Redis needs one
    return app


def test_app_lease_sets_the_interval_when_no_task_overrides_it():
    app = make_app("hb_plain")

    @app.task(base=LimitedTask, semaphore="plain", limit=1, shared=False)
    def plain() -> None: ...

    assert renew_interval(app) == 60.0 / 4


def test_a_shorter_per_task_lease_shortens_the_interval():
    app = make_app("hb_short")

    @app.task(
        base=LimitedTask, semaphore="short", limit=1, semaphore_lease_timeout=5.0, shared=False
    )
    def short_lease() -> None: ...

    assert renew_interval(app) == 5.0 / 4


def test_a_per_task_heartbeat_interval_is_honoured():
    app = make_app("hb_own")

    @app.task(
        base=LimitedTask, semaphore="own", limit=1, semaphore_heartbeat_interval=0.5, shared=False
    )
    def own_interval() -> None: ...

    assert renew_interval(app) == 0.5
