"""Lines with room to spare: new tasks skip the place at publish, keeping their order.

A place taken at publish is what keeps FIFO by submission order while a line forms
(`celery_semaphore.publish`). Where nobody waits and most permits are free (a
per-queue cap that never binds, the common case for short tasks), it is one script
call a task, and the worker's attempt then takes the line's path (it presents a
place) instead of the short one: about a third of a no-op task's cost
(docs/benchmarks.md).

So a publisher that finds **at least `MIN_FREE` permits free beyond those held
and those the line's places will take** sends new tasks of that semaphore without a
place, at most a quarter of those permits and for at most `WINDOW` seconds; then it
looks again. It finds that out from the reply of a place it takes (a line without
room), or, where it has not taken one lately, from one read of the semaphore's
counts (counts.lua, O(log n)), so a roomy line stays empty and the worker's calls
take their short path::

    publish #1 -> counts: 10,000, 10 held, 0 in line -> room: 2,497 tasks, 0.25 s
    publish #1..  -> no place: the message carries its publish time as its ticket
    worker: attempt(ticket=publish time) -> nobody in line: granted (the short path)
    publish #n, 0.25 s later -> counts again (or a place, where the room ran out)

The ticket a task sent without a place carries is its publish time on the Redis
server's clock (tickets are the server's microseconds), estimated from the server's
time in the last reply, and never below a ticket this process saw or gave before.
Presented at the worker, it stands in the line where a place taken at publish would
have stood, so the task keeps its order among later tasks that wait (give or take
the time a reply takes to arrive, and the millisecond counts carry the time in:
a task may stand just ahead of a place another process took a moment before it). What it does not
do while it is in the broker is hold back a later task that finds a permit free: if
the free permits run out meanwhile, such a later task may start first. Each
publisher process spends its own quarter: N processes publishing into one line at
once may send N/4 times its free permits without places. Only a line without
priority, accounts, weights or a rate qualifies: those order the line by more than
time.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from dataclasses import dataclass

from .core import Place
from .core.results import SemaphoreCounts
from .formats import Gate

#: The fewest free permits (with nobody waiting) for which new tasks skip their place.
MIN_FREE = 8
#: How long a look at a line lasts before the next task takes a place again (s).
WINDOW = 0.25


@dataclass
class _Room:
    tasks: int  # that may still go without a place (0: a look that found no room)
    until: float  # time.monotonic(): the look is stale after this
    offset_us: int  # the Redis server's clock less this process's, in µs
    last: int  # the latest ticket seen or given: the next one given is later


class RoomAtPublish:
    """Per semaphore name, the room this process last saw in its line (one per app)."""

    def __init__(self) -> None:
        self._rooms: dict[str, _Room] = {}
        self._lock = threading.Lock()
        forget = weakref.WeakMethod(self._forget)
        os.register_at_fork(after_in_child=lambda: (method := forget()) and method())

    def saw(self, gate: Gate, place: Place) -> None:
        """A place was just taken at publish: the room its reply shows. (Of a gate
        that does not qualify, nothing: its ticket is not a time, a priority's or an
        account's turn can be weeks ahead of the clock.)"""
        if not qualifies(gate):
            return
        free = place.limit - place.holders - place.position  # less its place and those ahead
        stopped = place.draining or place.resumes_in is not None
        self._note(gate, 0 if stopped else free, place.ticket, place.ticket)

    def needs_look(self, gate: Gate) -> bool:
        """Whether to read ``gate``'s counts before taking a place (`looked()`)."""
        if not qualifies(gate):
            return False
        with self._lock:
            room = self._rooms.get(gate.name)
        return room is None or time.monotonic() > room.until

    def looked(self, gate: Gate, counts: SemaphoreCounts | None) -> None:
        """``gate``'s counts as just read (None: no semaphore of that name yet)."""
        if counts is None:
            self._note(gate, 0, 0, 0)
            return
        free = counts.effective_limit - counts.holder_count - counts.waiter_count
        stopped = counts.draining or counts.rate is not None
        now_us = int(counts.server_time * 1_000_000)
        self._note(gate, 0 if stopped else free, now_us, 0)

    def _note(self, gate: Gate, free: int, server_us: int, ticket: int) -> None:
        tasks = free // 4 if free >= MIN_FREE else 0  # (callers see that gate qualifies)
        offset = server_us - time.time_ns() // 1000 if server_us else 0
        with self._lock:
            last = max(ticket, self._rooms[gate.name].last if gate.name in self._rooms else 0)
            self._rooms[gate.name] = _Room(tasks, time.monotonic() + WINDOW, offset, last)

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
            room.last = max(time.time_ns() // 1000 + room.offset_us, room.last + 1)
            return room.last

    def _forget(self) -> None:
        """In a forked child: no room (its parent may spend what it saw), a new lock."""
        self._rooms = {}
        self._lock = threading.Lock()


def qualifies(gate: Gate) -> bool:
    """Whether a line of ``gate`` is ordered by time alone (see the module's text),
    with a declared limit that could leave room."""
    return (
        gate.limit >= MIN_FREE
        and gate.rate is None
        and not gate.shadow
        and gate.weight == 1
        and gate.priority == 0
        and gate.fair_key is None
    )
