"""Pub/sub connections kept between waits in place, per client and process.

A wait in place listens on its semaphores' wake channels. A new pub/sub object
per wait costs a TCP connect, the client's handshake, a SUBSCRIBE and a close:
about four round trips of CPU on each side, more than the script calls of the
wait itself. So a wait that ends normally unsubscribes (and reads the reply, so
the connection is quiet again) and leaves its pub/sub object here for the next
wait of the same process; the semaphores (`core._async.semaphore.listen`) take
from here before they make a new one.

What is kept is unsubscribed: Redis sends it nothing while it idles. At most
`KEEP` per client are kept; a process that forked does not use its parent's.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

#: Idle pub/sub objects kept per client (a thread pool's waits in place at once
#: beyond this make their own, closed after use).
KEEP = 4


class IdleListeners:
    """The idle pub/sub objects of each client (held weakly: a client nobody uses
    any more goes, and its connections with it)."""

    def __init__(self) -> None:
        self._idle: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def take(self, client: Any) -> Any | None:
        """An idle pub/sub object of ``client``, unsubscribed, or None."""
        with self._lock:
            self._forget_parent()
            idle = self._idle.get(client)
            return idle.pop() if idle else None

    def give(self, client: Any, pubsub: Any) -> bool:
        """Keep ``pubsub`` (unsubscribed, its replies read) for the next wait; False
        if enough are kept already (the caller closes it)."""
        with self._lock:
            self._forget_parent()
            idle = self._idle.setdefault(client, [])
            if len(idle) >= KEEP:
                return False
            idle.append(pubsub)
            return True

    def _forget_parent(self) -> None:
        """After a fork, the parent's connections are not this process's to use
        (nor to close: closing here would not close them there)."""
        if self._pid != os.getpid():
            self._idle = weakref.WeakKeyDictionary()
            self._pid = os.getpid()


LISTENERS = IdleListeners()
