"""`events.listened`: a task's hot path skips a signal nobody hears, and only then."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery

from celery_semaphore import events, signals
from celery_semaphore.state import state_of
from celery_semaphore.wiring import install

MakeApp = Callable[..., Celery]


def test_nobody_listens_with_events_off(make_app: MakeApp) -> None:
    app = make_app(semaphore_send_events=False)
    install(app)  # connects the event sender to every signal of the package
    assert not events.listened(signals.permit_granted, app)
    assert not events.listened(signals.permit_released, app)


def test_the_event_sender_listens_when_events_are_on(make_app: MakeApp) -> None:
    on = make_app(semaphore_send_events=True)
    install(on)
    assert events.listened(signals.permit_granted, on)
    follows_worker = make_app()  # semaphore_send_events None: the worker's -E
    install(follows_worker)
    assert not events.listened(signals.permit_granted, follows_worker)
    state_of(follows_worker).worker_events = True
    assert events.listened(signals.permit_granted, follows_worker)


def test_any_other_receiver_listens(make_app: MakeApp) -> None:
    app = make_app(semaphore_send_events=False)
    install(app)
    heard: list[Any] = []

    def receiver(sender: Any = None, **fields: Any) -> None:
        heard.append(fields)

    signals.permit_released.connect(receiver)
    try:
        assert events.listened(signals.permit_released, app)
        assert not events.listened(signals.permit_granted, app)
    finally:
        signals.permit_released.disconnect(receiver)
    assert not events.listened(signals.permit_released, app)
