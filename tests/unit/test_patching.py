"""Queue caps for plain tasks: the worker wraps every task class once (never
Celery's own, never a LimitedTask), so their retries count waits like a
LimitedTask's do."""

from __future__ import annotations

from collections.abc import Callable

from celery import Celery
from celery.app.task import Context

from celery_semaphore import LimitedTask
from celery_semaphore.formats import WAIT_HEADER
from celery_semaphore.patching import PATCHED, admit_every_task
from celery_semaphore.retry import WAITS_MARK

MakeApp = Callable[..., Celery]


def test_every_plain_task_class_is_wrapped_once(make_app: MakeApp) -> None:
    app = make_app()
    app.finalize()

    @app.task(shared=False)
    def plain(x: int) -> int:
        return x * 2

    @app.task(base=LimitedTask, semaphore="s", limit=1, shared=False)
    def limited() -> None: ...

    limited_call = type(limited).__call__
    admit_every_task(app)
    wrapped = type(plain).__call__
    assert getattr(type(plain), PATCHED) is True
    assert wrapped.__wrapped__ is not None  # type: ignore[attr-defined]
    assert type(limited).__call__ is limited_call  # has admission built in
    builtins = [task for name, task in app.tasks.items() if name.startswith("celery.")]
    assert builtins and not any(getattr(type(t), PATCHED, False) for t in builtins)

    admit_every_task(app)  # a second worker start in the same process
    assert type(plain).__call__ is wrapped


def test_a_wrapped_task_called_directly_runs_its_body(make_app: MakeApp) -> None:
    app = make_app()
    app.finalize()

    @app.task(shared=False)
    def plain(x: int) -> int:
        return x * 2

    admit_every_task(app)
    assert plain(21) == 42  # called directly: no gates, no Redis


def test_a_wrapped_tasks_retry_counts_the_waits_back(make_app: MakeApp) -> None:
    app = make_app()
    app.finalize()

    @app.task(shared=False)
    def plain() -> None: ...

    admit_every_task(app)
    request = Context(id="t1", args=(), kwargs={}, retries=1, headers={})
    setattr(request, WAITS_MARK, 4)
    signature = plain.signature_from_request(request, retries=2)
    assert signature.options["retries"] == 6
    assert signature.options["headers"][WAIT_HEADER]["waits"] == 4
