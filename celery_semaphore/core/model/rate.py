"""Rates: GCRA, the generic cell rate algorithm, as lua/common_rates.lua has it
(effective_rate(), rate_tat(), rate_room(), slot_in(), spend_rate())."""

from __future__ import annotations

import math
from dataclasses import dataclass

#: "No rate": every grant is allowed (the scripts' math.huge).
UNBOUNDED = math.inf


@dataclass(frozen=True)
class Rate:
    """At most ``burst`` grants at once after an idle spell, then one every
    ``interval_us`` (the scripts' "<interval µs>|<burst>")."""

    interval_us: int
    burst: int = 1


@dataclass(frozen=True)
class Room:
    """How many grants the rate allows now (``grants``; UNBOUNDED without a rate), and
    µs from now until the first one after those (``next_us``; 0 without a rate)."""

    grants: float
    next_us: int

    def slot_in(self, interval_us: int, position: int) -> int:
        """µs from now until the rate allows a grant to the waiter whose grants and those
        of the waiters ahead add up to ``position``: 0 within the room, then one interval
        apart after the first slot past it (slot_in())."""
        if position <= self.grants:
            return 0
        return self.next_us + (position - int(self.grants) - 1) * interval_us


NO_ROOM_LIMIT = Room(UNBOUNDED, 0)


def rate_tat(tat: int | None, rate: Rate, now_us: int) -> int:
    """The theoretical arrival time of the next grant, as the next grant sees it.

    Why: a grant that comes up to half an interval after its slot (a waiter's round
    trip, a hand-over) keeps the schedule, so the long-run rate is the rate and not the
    rate less those delays; an older tat means the rate was idle: it starts from now."""
    last = tat or 0
    if last < now_us - rate.interval_us // 2:
        return now_us
    return last


def rate_room(rate: Rate | None, tat: int | None, pause_until_ms: int | None, now_us: int) -> Room:
    """The grants a rate allows now: those whose slots have come,
    floor((now + burst x interval - tat) / interval), at least 0; none while a
    RateLimited pause lasts (then the first one comes when it ends).

    Why: GCRA keeps one number per rate, and a grant is allowed while
    tat - now <= (burst - 1) x interval."""
    if rate is None:
        return NO_ROOM_LIMIT
    pause_us = (pause_until_ms or 0) * 1000 - now_us
    if pause_us > 0:
        return Room(0, pause_us)
    start = rate_tat(tat, rate, now_us)
    grants = max(0, (now_us + rate.burst * rate.interval_us - start) // rate.interval_us)
    return Room(grants, start + (grants - rate.burst + 1) * rate.interval_us - now_us)


def spend(rate: Rate, tat: int | None, grants: int, now_us: int) -> int:
    """The tat after ``grants`` made now: it moves on by that many intervals.

    Why: a grant spends its interval whatever happens to its permit afterwards (only a
    permit given back unused gives its intervals back: see `give_back`)."""
    return rate_tat(tat, rate, now_us) + grants * rate.interval_us


def give_back(rate: Rate, tat: int, grants: int) -> int:
    """The tat after a permit its task never used is released (release.lua, ARG.unused):
    its grants' intervals are given back, from the stored tat as it is."""
    return tat - grants * rate.interval_us
