"""Looking after parked tasks from a worker, once per beat (handover mode).

In every semaphore that has parked tasks (found in the parked index,
`celery_semaphore.core.parked_index`) one dispatch call publishes those whose turn
came while nobody called (a lease ran out), publishes again those whose publisher
died before publishing (past ``semaphore_handover_deadline``), and drops revoked
ones from the line. Each semaphore is looked after on its own: one that fails does
not stop the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from celery_semaphore.config import get_config
from celery_semaphore.core import parked_index
from celery_semaphore.core.connection import mask_url
from celery_semaphore.core.discovery import index_parked, parked_counts
from celery_semaphore.core.errors import SemaphoreConnectionError, SemaphoreError
from celery_semaphore.formats import Gate
from celery_semaphore.gates import semaphore_of
from celery_semaphore.state import state_of

logger = logging.getLogger(__name__)


class ParkedLook:
    """The parked tasks a worker looks after; ``parked_in``: the semaphores that held
    parked messages at the last look (a data loss there lost them)."""

    def __init__(self, app: Any, revoked: Callable[[], Iterable[str]]) -> None:
        self.app = app
        self.revoked = revoked
        self.parked_in: set[str] = set()
        self._dropped: set[str] = set()

    def look(self) -> None:
        """One dispatch call per semaphore in the parked index (the first look also
        lists the semaphores parked in before the index, with one SCAN); then the
        names whose parked tasks are gone leave the index."""
        config = get_config(self.app)
        client = state_of(self.app).semaphores.client(config.redis_url)
        url = mask_url(config.redis_url)
        revoked = set(self.revoked())
        self._dropped &= revoked
        drop = sorted(revoked - self._dropped)
        index_parked(client, config.namespace, url)
        now_ms, entries = parked_index.read(client, config.namespace, url)
        names = [name for name, _ in entries]
        # those parked in at the last look too: the first call after a loss notices it
        for name in sorted(set(names) | self.parked_in):
            try:
                semaphore_of(self.app, Gate(name, 1), config).dispatch(drop)
            except SemaphoreConnectionError:
                raise  # Redis away: every other call would fail too; the next beat looks again
            except SemaphoreError as error:  # this semaphore only: the others are looked after
                logger.warning("could not hand over parked tasks of %s: %s", name, error)
        self.parked_in = self._with_parked_tasks(client, set(names))
        self._dropped.update(drop)
        parked_index.forget_idle(client, config.namespace, now_ms, entries, url)

    def _with_parked_tasks(self, client: Any, names: set[str]) -> set[str]:
        """The semaphores among ``names`` (those with a ``parked`` hash) that hold
        parked messages: the hash also keeps tasks waiting in place and arrived
        hand-overs, which a loss does not lose (their messages are with a worker or in
        the broker)."""
        config = get_config(self.app)
        counts = parked_counts(client, config.namespace, sorted(names), mask_url(config.redis_url))
        return {name for name, count in counts.items() if count > 0}
