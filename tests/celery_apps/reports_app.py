"""A project's Celery app as ``proj/celery.py`` defines it: at module level, with its
production servers, routes and a queue cap, and LimitedTasks. Nothing here is for
tests; test_module_app_fixtures.py runs this app with no server at all
(docs/getting-started.md, "Testing your own tasks")."""

from __future__ import annotations

import time

from celery import Celery

from celery_semaphore import LimitedTask

app = Celery("reports_app", broker="amqp://guest:guest@rabbitmq.internal:5672//")
app.conf.update(
    result_backend="redis://redis.internal:6379/1",
    semaphore_redis_url="redis://redis.internal:6379/2",
    task_routes={"reports_app.build_report": {"queue": "reports"}},
    semaphore_queue_limits={"reports": 1},
)


def query_warehouse(report_id: int) -> list[int]:
    """The slow call the caps protect."""
    time.sleep(0.2)
    return list(range(report_id))


@app.task(name="reports_app.build_report", base=LimitedTask, semaphore="warehouse", limit=2)
def build_report(report_id: int) -> int:
    return len(query_warehouse(report_id))


@app.task(name="reports_app.export_rows", base=LimitedTask, semaphore="warehouse", limit=2)
def export_rows(report_id: int) -> int:
    return len(query_warehouse(report_id))
