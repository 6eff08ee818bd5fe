"""Parking and handover (lua/common_parked.lua, dispatch() in lua/common_after_free.lua,
park.lua, dispatch.lua, claim.lua): a waiter may leave a payload instead of asking
again; the semaphore hands it over (to be published) when its turn is near.

The rules that decide, as pure functions of the state they read; `SemaphoreModel`
applies them. A waiter blocked in place (wait_for_turn) is marked here too (``w``:
`Parking.mark_in_place`); what a release does for it is in after_free.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from .rate import Rate, Room
from .replies import Claimed

#: How long a tombstone (``d``: arrived, ``x``: served by another copy) is kept.
TOMBSTONE_MS = 3_600_000


class State(str, Enum):
    """A parked record's state (see the table in lua/common_parked.lua)."""

    PARKED = "p"  # it left its payload and stopped asking
    HANDED = "h"  # its payload was handed over, its copy not arrived yet
    ARRIVED = "d"  # the copy handed over last arrived (a tombstone)
    SERVED = "x"  # it was served by another copy: any copy on its way is stale
    IN_PLACE = "w"  # it waits in place, subscribed to the wake channel (mark: its lease)


@dataclass(frozen=True)
class Record:
    """A parked record: the handover ``token`` of the copy handed over last (0 before
    any), its ``state``, its ``mark`` (parked: the released count when it parked, a
    permit released since says the line moved; handed over again after its deadline:
    the token of the copy handed over before, which may still be on its way (`claim`
    gives it back), else 0; waiting in place: the lease, ms, of the permit a release
    may grant it) and its ``payload``."""

    token: int
    state: State
    mark: int
    payload: str


@dataclass(frozen=True)
class Dispatch:
    """What a client that publishes handovers passes (protocol's ``dispatch``): how far
    ahead waiters are handed over (``max_block_ms``), how long a handed-over copy has
    to arrive (``deadline_ms``), and the lead under a rate (``lead_ms``)."""

    max_block_ms: int
    deadline_ms: int
    lead_ms: int = 200


@dataclass(frozen=True)
class Handover:
    """A parked waiter now due: publish ``payload`` to arrive with ``token``, after
    ``delay_ms``."""

    holder: str
    token: int
    payload: str
    delay_ms: int = 0


@dataclass(frozen=True)
class ParkIfFar:
    """What a publisher passes to park a new place at once when its turn is far
    (enqueue.lua's `Far` arguments): the rate window (µs), the payload around the
    ticket (``head`` + ticket + ``tail``), the park lease, the due time (0: none), and
    its `Dispatch`."""

    window_us: int
    head: str
    tail: str
    park_lease_ms: int
    dispatch: Dispatch
    due_ms: int = 0


class Arrival(str, Enum):
    VALID = "valid"  # the copy handed over last: its record becomes a tombstone
    AGAIN = "again"  # that copy delivered again, or no record: proceed as usual
    STALE = "stale"  # an older copy, or one whose waiter was served: drop it


def arrival(record: Record | None, token: int) -> Arrival:
    """What a waiter presenting handover ``token`` is (arrival()).

    Why: a copy may be delivered twice, or handed over again after its deadline while
    the first copy was only late. While it is handed over (``h``), the first copy to
    arrive takes the place, whichever handover's it is, and any other copy is stale
    after it: a message moved out of a parking queue is the task's only copy, and a
    later handover of it may find nothing left to move (its token must not make that
    copy stale). A copy presenting the token of its arrival again is a redelivery."""
    if record is None:
        return Arrival.AGAIN
    if record.state is State.SERVED:
        return Arrival.STALE
    if record.token != token:
        return Arrival.VALID if record.state is State.HANDED else Arrival.STALE
    if record.state in (State.ARRIVED, State.IN_PLACE):
        return Arrival.AGAIN
    return Arrival.VALID


@dataclass(frozen=True)
class Window:
    """How far down the line dispatch() looks, from the limit that binds (``limit``),
    the permits held, the average hold time, the rate's room, and the caller's
    `Dispatch`."""

    permits: float  # the free permits (math.inf where no limit binds)
    room: Room  # the rate's room (unbounded where no rate binds)
    count: float  # how many waiters from the head are looked at
    rate_window_ms: float


def window(
    limit: float,
    held: int,
    *,
    paused: bool,
    hold_ms: float,
    room: Room,
    rate: Rate | None,
    cfg: Dispatch,
) -> Window:
    """The waiters due for a handover are among the first ``free + window``: the free
    permits (a waiter among them is granted when it comes), and the next ``window``,
    the waiters served within max_block at the average hold time (at most the limit),
    whose turn is near. Under a rate, no further than the rate's window allows
    (the lead, or three intervals if longer; at most max_block). While paused
    (draining) nobody is near. At most 1,000 waiters a call."""
    free, near = 0.0, 0.0
    if not paused:
        free = max(0, limit - held)
        near = limit
    if hold_ms > 0 and limit < math.inf:
        near = min(near, math.floor(cfg.max_block_ms * limit / hold_ms))
    permits = free
    free = min(free, room.grants)
    count = free + near
    rate_window_ms: float = cfg.max_block_ms
    if rate is not None:
        rate_window_ms = min(cfg.max_block_ms, max(cfg.lead_ms, 3 * rate.interval_us / 1000))
        count = min(count, room.grants + math.floor(rate_window_ms * 1000 / rate.interval_us) + 2)
    return Window(permits, room, min(count, 1000), rate_window_ms)


class Parking:
    """The parked records of one semaphore (KEYS[7] parked, KEYS[8] handed) and the
    handover sequence: each rule of lua/common_parked.lua once."""

    def __init__(self) -> None:
        self.records: dict[str, Record] = {}
        #: holder -> when to hand it over (again), or forget its record (ms).
        self.handed: dict[str, int] = {}
        self.handover: int | None = None  # the last handover token (meta.handover)

    def count(self, state: State) -> int:
        """n_parked, n_handed: the records in that state."""
        return sum(r.state is state for r in self.records.values())

    def state_of(self, holder: str) -> State | None:
        record = self.records.get(holder)
        return None if record is None else record.state

    def forget(self, holder: str) -> None:
        """Its place lapsed, it left the line, or its tombstone aged: no record."""
        self.records.pop(holder, None)
        self.handed.pop(holder, None)

    def served(self, holder: str, now_ms: int) -> None:
        """``holder`` got a permit without presenting a handover token (served()): a
        copy handed over and still on its way is stale from now (``x``, kept an hour to
        tell it so); a parked payload is not needed any more."""
        record = self.records.get(holder)
        if record is None:
            return
        if record.state is State.HANDED:
            self.records[holder] = Record(record.token, State.SERVED, 0, "")
            self.handed[holder] = now_ms + TOMBSTONE_MS
        elif record.state is State.PARKED:
            self.forget(holder)
        else:
            self.unmark_in_place(holder)

    def mark_in_place(self, holder: str, lease_ms: int) -> None:
        """Refused while it waits in place (mark_in_place()): a release may grant it a
        permit of ``lease_ms`` directly. Only a waiter that asks itself is marked (no
        record, a tombstone ``d`` whose token it keeps, or a mark already): a parked or
        handed-over one is not waiting anywhere, and a served one (``x``) is kept as the
        tombstone that tells its stale copy."""
        record = self.records.get(holder)
        if record is None or record.state in (State.ARRIVED, State.IN_PLACE):
            token = 0 if record is None else record.token
            self.records[holder] = Record(token, State.IN_PLACE, lease_ms, "")

    def unmark_in_place(self, holder: str) -> None:
        """It no longer waits in place (unmark_in_place()): it asked without waiting, was
        served, or left. A mark made on a tombstone becomes that tombstone again (its
        token still tells a stale copy); any other goes."""
        record = self.records.get(holder)
        if record is None or record.state is not State.IN_PLACE:
            return
        if record.token == 0:
            self.forget(holder)
        else:
            self.records[holder] = Record(record.token, State.ARRIVED, 0, "")

    def in_place_lease(self, holder: str) -> int | None:
        """The lease a waiter in place asked for (ms), or None if it is not waiting so."""
        record = self.records.get(holder)
        return record.mark if record is not None and record.state is State.IN_PLACE else None

    def arrive(self, holder: str, token: int, now_ms: int) -> Arrival:
        """A copy presenting handover ``token`` asks (acquire.lua: arrival() first)."""
        verdict = arrival(self.records.get(holder), token)
        if verdict is Arrival.VALID:
            self.records[holder] = Record(token, State.ARRIVED, 0, "")
            self.handed[holder] = now_ms + TOMBSTONE_MS
        return verdict

    def leave_payload(
        self, holder: str, payload: str, *, released: int, due_ms: int, now_ms: int
    ) -> None:
        """It parks (leave_payload()): token 0, marked with the permits released so far,
        due ``due_ms`` from now at the latest (0: only when its turn is near)."""
        self.records[holder] = Record(0, State.PARKED, released, payload)
        if due_ms > 0:
            self.handed[holder] = now_ms + due_ms
        else:
            self.handed.pop(holder, None)

    def hand_over(self, holder: str, payload: str, *, cfg: Dispatch, delay_ms: int,
                  now_us: int, mark: int = 0) -> Handover:  # fmt: skip
        """A new handover token each time (seq_after(), like tickets), so the copy handed
        over last is told from older ones; due again after the deadline if it does not
        arrive (its publisher may have died). ``mark``: handed over again, the token of
        the copy handed over before (`Record`), else 0."""
        now_ms = now_us // 1000
        self.handover = max((self.handover or 0) + 1, now_us)
        self.records[holder] = Record(self.handover, State.HANDED, mark, payload)
        self.handed[holder] = now_ms + delay_ms + cfg.deadline_ms
        return Handover(holder, self.handover, payload, delay_ms)

    def late(self, now_ms: int) -> list[str]:
        """The handed entries now due, in the sorted set's order."""
        due = [(at, h.encode(), h) for h, at in self.handed.items() if at <= now_ms]
        return [h for _, _, h in sorted(due)]

    def claim(self, taken: str, handed: str, token: int) -> Claimed:
        """Who the message ``taken`` from a parking queue is, for the process that got
        the handover (``handed``, ``token``) and took that queue's head (claim.lua).

        Why: a broker queue hands out only its head, in arrival order, while the line
        hands over in ticket order; so the message in hand may be another waiter's.
        Rather than put it back and dig for its own, the process gives the turn to
        the message it holds (a swap), and the waiter it was handed over to goes back
        to wait for the next. Timeline::

            parking queue: [X, H] (arrival order)      line: H, then X (ticket order)
            dispatch:  H is due -> (H, T); H: h, token T, due again at T's deadline
            process P: takes the queue's head: X
            P: claim(X, H, T) -> PUBLISH; X: h, token T, due at T's deadline;
               H: p, mark 0 (due again at once when a permit frees, or at that
               deadline) -- or, if an earlier copy of H may still be on its way
               (handed over again after its deadline: its mark), h with its token
            P: publishes X's message with T; X arrives with T: valid

        In order: X not parked (no record, or waiting in place) is ABSENT; a copy of
        X arrived or X was served (d, x): STALE; the handover no longer H's latest
        (H not h with token T): VOID; else PUBLISH (swapping when X is not H). Only
        a swap changes anything: nobody leaves or joins the line, no permit frees."""
        message = self.records.get(taken)
        if message is None or message.state is State.IN_PLACE:
            return Claimed.ABSENT
        if message.state in (State.ARRIVED, State.SERVED):
            return Claimed.STALE
        turn = self.records.get(handed)
        if turn is None or turn.state is not State.HANDED or turn.token != token:
            return Claimed.VOID
        if taken != handed:
            self.records[taken] = Record(token, State.HANDED, 0, message.payload)
            self.handed[taken] = self.handed[handed]
            if turn.mark:
                self.records[handed] = Record(turn.mark, State.HANDED, 0, turn.payload)
            else:
                self.records[handed] = Record(0, State.PARKED, 0, turn.payload)
        return Claimed.PUBLISH
