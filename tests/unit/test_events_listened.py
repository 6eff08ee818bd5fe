"""`events.listened`: a task's hot path skips a signal nobody hears, and only then."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery

from celery_semaphore import events, signals
from celery_semaphore.state import state_of
from celery_semaphore.wiring import install

MakeApp = Callable[..., Celery]
SIGNALS = (signals.permit_granted, signals.permit_released)


@pytest.fixture(autouse=True)
def only_the_event_sender() -> Iterator[None]:
    """The signals with no receiver but this package's event sender during the test
    (another test of the session may have left one connected); the others back after,
    with any connected meanwhile."""
    saved = {signal: list(signal.receivers) for signal in SIGNALS}
    for signal in SIGNALS:
        ours = id(events._handlers.get(signal))
        signal.receivers = [r for r in signal.receivers if r[0][0] == ours]
        signal.sender_receivers_cache.clear()
    yield
    for signal, receivers in saved.items():
        signal.receivers = receivers + [r for r in signal.receivers if r not in receivers]
        signal.sender_receivers_cache.clear()


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
