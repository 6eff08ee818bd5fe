"""Whose settings a worker hands a semaphore's parked tasks over with (no Redis)."""

from __future__ import annotations

from celery import Celery

from celery_semaphore import LimitedTask, per_key
from celery_semaphore.worker import parked_look
from celery_semaphore.worker.parked_look import ParkedLook


def test_per_key_names_learned_from_running_tasks_are_bounded() -> None:
    """A key function makes a name per key for the life of a worker: the learned
    settings keep the `LEARNED_MOST` last names (the oldest goes back to the app's
    settings), and a name a task declares keeps its own settings whatever runs on it."""
    app = Celery("look", broker="memory://", set_as_current=False)
    app.conf.semaphore_handover_deadline = 300.0
    app.conf.semaphore_redis_url = "redis://semaphores.internal:6379/0"

    @app.task(
        base=LimitedTask, limit=1, name="look.per_key", shared=False,
        semaphore=per_key("customers", lambda customer, **_: f"customer-{customer}"),
        semaphore_handover_deadline=2.0,
    )  # fmt: skip
    def per_customer(customer: str) -> None: ...

    @app.task(
        base=LimitedTask, limit=1, name="look.named", shared=False, semaphore="named",
        semaphore_handover_deadline=7.0,
    )  # fmt: skip
    def named() -> None: ...

    look = ParkedLook(app, list)
    task = app.tasks[per_customer.name]
    for key in range(parked_look.LEARNED_MOST + 1):
        look.learn(f"customer-{key}", task)
    look.learn("customer-1", task)  # seen again: kept longest now
    look.learn(f"customer-{parked_look.LEARNED_MOST + 1}", task)  # drops customer-2
    assert look.config_for("customer-0").handover_deadline == 300.0  # the oldest went
    assert look.config_for("customer-1").handover_deadline == 2.0
    assert look.config_for("customer-2").handover_deadline == 300.0
    assert look.config_for(f"customer-{parked_look.LEARNED_MOST}").handover_deadline == 2.0
    assert len(look._learned) == parked_look.LEARNED_MOST
    look.learn("named", task)
    assert look.config_for("named").handover_deadline == 7.0
