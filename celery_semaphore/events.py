"""Celery events for permit waits, grants and losses, rates paused by a task
(``semaphore-rate-limited``), grants a shadow limit would have refused
(``semaphore-shadow-refused``), and a loss of Redis's data.

Their types do not start with ``task-``: Flower would take a custom ``task-*``
event as the task's new state. Event consumers count them (Flower's
``/metrics``: ``flower_events_total{type="semaphore-granted"}``; ``celery
events``). Sent only when ``semaphore_send_events`` is on, which by default
follows the worker's ``-E``.
"""

from __future__ import annotations

import logging
from typing import Any

from . import signals
from .config import get_config
from .state import state_of

logger = logging.getLogger(__name__)


def enabled(app: Any) -> bool:
    """``semaphore_send_events``, or where it is None, the worker's ``-E``."""
    setting = get_config(app).send_events
    return state_of(app).worker_events if setting is None else setting


def send(app: Any, hostname: str | None, type_: str, task_id: str, **fields: Any) -> None:
    if not enabled(app):
        return
    try:
        with app.events.default_dispatcher(hostname=hostname) as dispatcher:
            dispatcher.send(type_, uuid=task_id, retry=False, **fields)
    except Exception as error:  # monitoring must never break a task
        logger.debug("could not send %s event: %s", type_, error)


def _from_task(type_: str) -> Any:
    def handler(sender: Any = None, task_id: str = "", **fields: Any) -> None:
        fields.pop("signal", None)
        hostname = getattr(getattr(sender, "request", None), "hostname", None)
        send(sender.app, fields.pop("hostname", None) or hostname, type_, task_id, **fields)

    return handler


def _data_lost(sender: Any = None, **fields: Any) -> None:
    fields.pop("signal", None)
    send(sender, fields.pop("hostname", None), "semaphore-data-lost", "", **fields)


_handlers = {
    signals.data_lost: _data_lost,
    signals.permit_waiting: _from_task("semaphore-waiting"),
    signals.permit_granted: _from_task("semaphore-granted"),
    signals.permit_lost: _from_task("semaphore-lost"),
    signals.rate_limited: _from_task("semaphore-rate-limited"),
    signals.shadow_refused: _from_task("semaphore-shadow-refused"),
}


def connect() -> None:
    """Send an event for each of the package's signals (called once, by ``install``)."""
    for signal, handler in _handlers.items():
        signal.connect(handler, weak=False)


def listened(signal: Any, app: Any) -> bool:
    """Whether sending ``signal`` for a task of ``app`` reaches anyone: a receiver
    other than this module's event sender, or that sender with events on. Lets a
    task's hot path skip building and dispatching a signal nobody hears (Celery keys
    each receiver as ``((id of the receiver, id of the sender), receiver)``; a dead
    weak receiver counts as a listener, so the signal is then sent as before)."""
    ours = id(_handlers.get(signal))
    if any(key[0] != ours for key, _ in list(signal.receivers)):
        return True
    return bool(signal.receivers) and enabled(app)
