"""The entries of a semaphore, its holders (holders + hinfo) and its waiters (waiters +
wexp + winfo), as the scripts keep them; and what one acquire call works with (a
`Gate`: admit.lua's state of one semaphore in one call)."""

from __future__ import annotations

from dataclasses import dataclass

from .rate import Room


@dataclass
class Holding:
    """A holder (holders + hinfo): its fencing token, when it was first granted, its
    lease's end, the permits it holds (its seats), what it said of itself."""

    token: int
    acquired_ms: int
    expires_ms: int
    permits: int
    info: str


@dataclass
class Waiting:
    """A waiter (waiters + wexp + winfo): its ticket, its waiter lease's end, when it
    first asked, what it said of itself."""

    ticket: int
    expires_ms: int
    since_ms: int
    info: str


@dataclass(frozen=True)
class Judgement:
    """How the semaphore weighs a contender (admit.lua's weigh_gate()): the waiters
    ``ahead``, the permits held (``count``), the ``free`` permits, the permits and grants
    needed (its own and those of the waiters ahead), the shadow limits that ``would``
    have refused it, and the rate's ``room``."""

    admitted: bool
    ahead: int
    count: int
    free: int
    need_permits: int
    need_grants: int
    would: str
    room: Room


@dataclass
class Gate:
    """One semaphore's part in one acquire call (admit.lua's ``s``, made by open_gate()):
    the contender, what was reclaimed, its live permit, its place in line (``in_line``)
    and the ``ticket`` it is weighed at (its place, or the earlier one it presents),
    then the judgement, and whether it left the line or was granted."""

    holder: str
    handover: int | None
    reclaimed: int
    holding: Holding | None
    in_line: Waiting | None
    ticket: int | None
    judged: Judgement | None = None
    left: bool = False
    granted: bool = False
