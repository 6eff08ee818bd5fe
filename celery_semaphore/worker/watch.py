"""The watch connection: a worker notices a restart of the semaphores' Redis at once.

A thread holds a connection to the semaphores' Redis, subscribed to
``<namespace>:watch``
(the store's `watch()`). It breaks when Redis restarts or fails over, and once it
connects again (redis-py's pub/sub reconnects by itself, or this loop makes a new
one) it calls ``on_change``: the heartbeat then beats at once, and its calls notice
a loss of the data if there was one (`celery_semaphore.core.redis.epochs`). A message on
the channel calls it too: the CLI publishes one after a change that may admit tasks
(a resume, a raised limit, a release), so the beat hands over the parked tasks it
made due at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from celery_semaphore.config import get_config
from celery_semaphore.core.operations import Watching
from celery_semaphore.state import state_of

WATCH_RETRY = 0.1  # seconds between attempts of the watch connection to connect again
WATCH_POLL = 0.2  # seconds between two looks at the watch connection


class Watch:
    """The watch thread of one worker: ``on_change()`` after a reconnection or a
    message on the watch channel, until ``stop`` is set."""

    def __init__(self, app: Any, on_change: Callable[[], None], stop: threading.Event) -> None:
        self.app = app
        self.on_change = on_change
        self.stop = stop
        self.thread = threading.Thread(target=self._run, name="celery-semaphore-watch", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        config = get_config(self.app)
        watching: Watching | None = None
        broken = False
        while not self.stop.is_set():
            try:
                if watching is None:
                    store = state_of(self.app).semaphores.store(config.redis_url)
                    watching = store.watch(config.namespace)
                    if broken:
                        broken = False
                        self.on_change()
                # No blocking read: under gevent it would block the whole worker.
                if watching.heard():
                    self.on_change()
                self.stop.wait(WATCH_POLL)
            except Exception:  # broken, or its client closed under it: connect again
                if watching is not None:
                    watching.close()
                watching, broken = None, True
                self.stop.wait(WATCH_RETRY)
        if watching is not None:
            watching.close()
