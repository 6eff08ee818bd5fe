"""Looking after parked tasks from a worker, once per beat (handover mode).

In every semaphore that has parked tasks (found in the parked index,
`celery_semaphore.core.redis.parked_index`) one dispatch call publishes those whose turn
came while nobody called (a lease ran out), publishes again those whose publisher
died before publishing (past ``semaphore_handover_deadline``), and drops revoked
ones from the line. Each semaphore is looked after on its own: one that fails does
not stop the others, and with the hand-over settings of the tasks that use it
(`ParkedLook.config_for`), as their own releases hand over.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from celery_semaphore.config import SemaphoreConfig, get_config, task_config
from celery_semaphore.core.errors import SemaphoreConnectionError, SemaphoreError
from celery_semaphore.core.operations import OperatedStore
from celery_semaphore.formats import Gate
from celery_semaphore.gates import semaphore_of
from celery_semaphore.state import state_of

logger = logging.getLogger(__name__)

#: Semaphore names whose settings a worker keeps from the tasks it saw running (see
#: `ParkedLook.learn`), as many as the app state keeps semaphores.
LEARNED_MOST = 1024


class ParkedLook:
    """The parked tasks a worker looks after; ``parked_in``: the semaphores that held
    parked messages at the last look (a data loss there lost them)."""

    def __init__(self, app: Any, revoked: Callable[[], Iterable[str]]) -> None:
        self.app = app
        self.revoked = revoked
        self.parked_in: set[str] = set()
        self._dropped: set[str] = set()
        self._configs: dict[str, SemaphoreConfig] | None = None  # by semaphore name
        #: The settings of the semaphores no task declares by name (per-key ones), as
        #: seen running, the `LEARNED_MOST` last learned.
        self._learned: OrderedDict[str, SemaphoreConfig] = OrderedDict()

    def learn(self, name: str, task: Any) -> None:
        """``task`` uses semaphore ``name`` (a running request's gate: per-key names are
        known no other way): hand its parked tasks over with ``task``'s settings. The
        first task seen on a name stays; past `LEARNED_MOST` names, the one learned
        longest ago is forgotten (a key function makes a name per key, for the life of
        the worker): its parked tasks are handed over with the app's settings."""
        if name in self._declared_configs():
            return
        if name in self._learned:
            self._learned.move_to_end(name)
            return
        self._learned[name] = task_config(task)
        if len(self._learned) > LEARNED_MOST:
            self._learned.popitem(last=False)

    def config_for(self, name: str) -> SemaphoreConfig:
        """The settings semaphore ``name``'s parked tasks are handed over with: those of
        the task that declares it by name, or was seen running on it (per-task
        ``semaphore_handover_deadline`` and ``semaphore_max_block``); of several that
        disagree, the shortest deadline (a copy handed over again too soon is dropped
        by its token; one handed over too late waits); of those seen running, the first
        seen; else the app's."""
        return self._declared_configs().get(name) or self._learned.get(name) or get_config(self.app)

    def _declared_configs(self) -> dict[str, SemaphoreConfig]:
        if self._configs is None:
            configs: dict[str, SemaphoreConfig] = {}
            for task in list(self.app.tasks.values()):
                limits = getattr(type(task), "declared_limits", None) or []
                names = [limit.name for limit in limits if isinstance(limit.name, str)]
                if not names:
                    continue
                config = task_config(task)
                for name in names:
                    known = configs.get(name)
                    if known is None or config.handover_deadline < known.handover_deadline:
                        configs[name] = config
            self._configs = configs
        return self._configs

    def look(self) -> None:
        """One dispatch call per semaphore in the parked index (the first look also
        lists the semaphores parked in before the index, with one SCAN); then the
        names whose parked tasks are gone leave the index."""
        config = get_config(self.app)
        store = state_of(self.app).semaphores.store(config.redis_url)
        revoked = set(self.revoked())
        self._dropped &= revoked
        drop = sorted(revoked - self._dropped)
        index = store.parked_index(config.namespace)
        names = index.names
        # those parked in at the last look too: the first call after a loss notices it
        failed = False
        for name in sorted(set(names) | self.parked_in):
            try:
                semaphore_of(self.app, Gate(name, 1), self.config_for(name)).dispatch(drop)
            except SemaphoreConnectionError:
                raise  # Redis away: every other call would fail too; the next beat looks again
            except SemaphoreError as error:  # this semaphore only: the others are looked after
                logger.warning("could not hand over parked tasks of %s: %s", name, error)
                failed = True
        self.parked_in = self._with_parked_tasks(store, set(names))
        if not failed:  # else the revoked are named again next beat, where it failed too
            self._dropped.update(drop)
        index.forget_idle()

    def _with_parked_tasks(self, store: OperatedStore, names: set[str]) -> set[str]:
        """The semaphores among ``names`` (those with a ``parked`` hash) that hold
        parked messages: the hash also keeps tasks waiting in place and arrived
        hand-overs, which a loss does not lose (their messages are with a worker or in
        the broker)."""
        config = get_config(self.app)
        counts = store.parked_counts(config.namespace, sorted(names))
        return {name for name, count in counts.items() if count > 0}
