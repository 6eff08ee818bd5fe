"""Who hears of a loss of a store's data: a store that notices one (the Redis store's
epochs, `celery_semaphore.core.redis.epochs`) tells every listener of this process
with a `DataLoss`; the worker's heartbeat listens, to write its permits back at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from celery_semaphore.core.results import DataLoss

logger = logging.getLogger(__name__)

Listener = Callable[[DataLoss], None]

_listeners: list[Listener] = []


def listen(listener: Listener) -> None:
    """Call ``listener`` with each `DataLoss` this process notices (in the thread
    whose call noticed it: keep it short)."""
    _listeners.append(listener)


def unlisten(listener: Listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def tell(loss: DataLoss) -> None:
    """Tell every listener of ``loss``; one that fails does not break the call that
    noticed it."""
    for listener in list(_listeners):
        try:
            listener(loss)
        except Exception:
            logger.exception("a data-loss listener failed")
