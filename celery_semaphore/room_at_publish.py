"""Lines with room to spare: new tasks skip the place at publish, keeping their order.

A place taken at publish is what keeps FIFO by submission order while a line forms
(`celery_semaphore.publish`). Where nobody waits and most permits are free (a
per-queue cap that never binds, the common case for short tasks), it is one script
call a task, and the worker's attempt then takes the line's path (it presents a
place) instead of the short one: about a third of a no-op task's cost
(docs/benchmarks.md).

So a publisher that took a place and found **at least `MIN_FREE` permits free
beyond those the places ahead of it will take** sends the next tasks of that
semaphore without a place, at most a quarter of those permits and for at most
`WINDOW` seconds; then it takes a place again and looks anew::

    publish #1 -> take_place -> position 11, 9,990 of 10,000 free -> room: 2,495 tasks, 0.25 s
    publish #2..  -> no call: the message carries its publish time as its ticket
    worker: attempt(ticket=publish time) -> nobody ahead: granted (the short path)

The ticket a skipped task carries is its publish time on the Redis server's clock
(tickets are the server's microseconds), estimated from the ticket of the place
this process last took. Presented at the worker, it stands in the line where a
place taken at publish would have stood, so the task keeps its order among later
tasks that wait. What it does not do while it is in the broker is hold back a
later task that finds a permit free: if the free permits run out meanwhile (other
publishers, a burst larger than the room), such a later task may start first.
Only a line without priority, accounts, weights or a rate qualifies: those order
the line by more than time.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from dataclasses import dataclass

from .core import Place
from .wire import Gate

#: The fewest free permits (with nobody waiting) for which new tasks skip their place.
MIN_FREE = 8
#: How long a look at a line lasts before the next task takes a place again (s).
WINDOW = 0.25


@dataclass
class _Room:
    tasks: int  # that may still skip their place
    until: float  # time.monotonic(): the look is stale after this
    offset_us: int  # the Redis server's clock less this process's, in µs


class RoomAtPublish:
    """Per semaphore name, the room this process last saw in its line (one per app)."""

    def __init__(self) -> None:
        self._rooms: dict[str, _Room] = {}
        self._lock = threading.Lock()
        forget = weakref.WeakMethod(self._forget)
        os.register_at_fork(after_in_child=lambda: (method := forget()) and method())

    def saw(self, gate: Gate, place: Place) -> None:
        """A place was just taken at publish: how much room its reply shows."""
        free = place.limit - place.holders - (place.position - 1)  # less the places ahead
        open_line = not place.draining and place.resumes_in is None
        room = None
        if qualifies(gate) and open_line and free >= MIN_FREE:
            offset = place.ticket - time.time_ns() // 1000
            room = _Room(free // 4, time.monotonic() + WINDOW, offset)
        with self._lock:
            if room is None:
                self._rooms.pop(gate.name, None)
            else:
                self._rooms[gate.name] = room

    def skip(self, gate: Gate) -> int | None:
        """The ticket for a new task of ``gate`` sent without a place (its publish time
        on the server's clock, in µs), or None: take a place."""
        if not qualifies(gate):
            return None
        with self._lock:
            room = self._rooms.get(gate.name)
            if room is None or room.tasks <= 0 or time.monotonic() > room.until:
                return None
            room.tasks -= 1
            return time.time_ns() // 1000 + room.offset_us

    def _forget(self) -> None:
        """In a forked child: no room (its parent may spend what it saw), a new lock."""
        self._rooms = {}
        self._lock = threading.Lock()


def qualifies(gate: Gate) -> bool:
    """Whether a line of ``gate`` is ordered by time alone (see the module's text)."""
    return (
        gate.rate is None
        and not gate.shadow
        and gate.weight == 1
        and gate.priority == 0
        and gate.fair_key is None
    )
