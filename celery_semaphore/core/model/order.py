"""The order of the line: tickets, priority and fair share (lua/common_order.lua: "The
order of the line: priority and fair share", place_ticket(), new_ticket(), fair_head()).

Everything here is arithmetic on numbers the semaphore keeps; the numbers are stored
as the Lua stores them (`stored()`), so the model's tickets are the scripts' tickets
for the same clock readings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from celery_semaphore.core.constants import FAIR_TURN, PRIORITY_STEP

#: A key's tie (the order of keys within one turn) is the join count modulo this.
TIE_BITS = 1024


def seq_after(last: int | None, now_us: int) -> int:
    """The next ticket, fencing token or handover token: ``max(last + 1, now µs)``.

    Why: strictly increasing whatever the clock does (a clock that steps back, a
    meta hash that expired), and close to the time, so a ticket says when it was
    taken. seq_after() in lua/common_meta.lua."""
    return max((last or 0) + 1, now_us)


def stored(value: float) -> int:
    """A number as the scripts write it to Redis (fmt() in lua/common_keys.lua: an integral value
    as is, else rounded half to even), so later arithmetic starts from the same value.
    A fair tail of weight 3 moves on by 1048576 / 3 µs: the fraction is dropped here."""
    if value == int(value):
        return int(value)
    return int(f"{value:.0f}")


@dataclass(frozen=True)
class Asked:
    """A contender's `celery_semaphore.Ask` as the scripts receive it, resolved against
    the semaphore (its "weight text", acquire.lua's ARG.weight): ``permits``
    at once (k), the rate's ``grants`` (j), its ``priority`` (-255..255, higher first),
    and the ``fair_key`` whose turns it takes with that key's ``fair_weight``.

    The default (1|1, priority 0, no key) is not recorded for a waiter; any other ask
    is, while it waits (lua/common_weights.lua, "Weights": meta "w|<waiter>"), and the line reads
    the recorded asks of those ahead, not what they would ask now."""

    permits: int = 1
    grants: int = 1
    priority: int = 0
    fair_key: str | None = None
    fair_weight: int = 1

    @property
    def is_default(self) -> bool:
        return self.text == ""

    @property
    def text(self) -> str:
        """The weight text as the client writes it (``SemaphoreSpec.weight_arg``): two
        asks are the same ask when their texts are the same (weigh_waiter())."""
        if self.fair_key is not None:
            return (
                f"{self.permits}|{self.grants}|{self.priority}|{self.fair_weight}|{self.fair_key}"
            )
        if self.priority:
            return f"{self.permits}|{self.grants}|{self.priority}"
        return "" if self.permits == self.grants == 1 else f"{self.permits}|{self.grants}"


PLAIN_ASKED = Asked()


def asked_from_text(text: str) -> Asked:
    """The ask a weight text says (`Asked.text`, the other way): '' is the default."""
    if not text:
        return PLAIN_ASKED
    permits, grants, *rest = text.split("|", 4)
    priority = int(rest[0]) if rest else 0
    if len(rest) < 3:
        return Asked(int(permits), int(grants), priority)
    return Asked(int(permits), int(grants), priority, rest[2], int(rest[1]))


@dataclass(frozen=True)
class FairKey:
    """A fair key's record while it has waiters (meta "f|<key>").

    ``tail``: where its next waiter starts (at the earliest); ``urgent_tail``: where
    its next urgent waiter starts; ``waiting``: its waiters in line; ``grants``,
    ``minute``, ``grants_before``: its grants this minute and the minute before (for
    status); ``tie``: the low bits of its tickets, the order in which keys joined the
    rotation, so that keys sharing a turn do not collide."""

    tail: int = 0
    waiting: int = 0
    urgent_tail: int = 0
    grants: int = 0
    minute: int = 0
    grants_before: int = 0
    tie: int = 0


@dataclass(frozen=True)
class Placed:
    """Where a new ticket goes (place_ticket()): the ``ticket``; ``seq``, the next ticket
    in time (what meta.ticket becomes if it is taken); with a fair key also the key's
    record once taken, whether the record existed, the head it started from, and the
    least urgent priority the line has now seen."""

    ticket: int
    seq: int
    key: str | None = None
    record: FairKey | None = None
    existed: bool = False
    head: int = 0
    low: int = 0


def priority_ticket(seq: int, priority: int) -> int:
    """Without a fair key, priority p moves the ticket p x PRIORITY_STEP earlier.

    Why: a step longer than any wait, so a more urgent waiter goes ahead of every less
    urgent one, and equals keep time order (their tickets are in time)."""
    return seq - priority * PRIORITY_STEP


def fair_head(line: list[int], seq: int, clock: int | None) -> int:
    """The head of the line as the fair keys see it: the lowest ticket within half a
    PRIORITY_STEP of max(``seq``, the fair ``clock``), else ``seq``. ``line``: the
    tickets in line, in order.

    Why: a ticket a priority moved without a key sits 2^40 µs away; starting a key
    there would give it that head start. Fair tickets run ahead of the clock under a
    backlog, so the head is looked for near the fair clock when that is ahead."""
    anchor = max(seq, clock or 0)
    band = PRIORITY_STEP // 2
    for ticket in line:
        if anchor - band <= ticket <= anchor + band:
            return ticket
    return seq


def urgent(priority: int, low: int) -> bool:
    """A fair waiter is urgent when more urgent than the least urgent priority the line
    has seen (``low``, at most 0): it starts at its key's next turn (the urgent tail),
    and its key's tail still moves on, so it pays the turn back at the end of its line."""
    return priority > low


def place_fair(
    key: str,
    ask: Asked,
    *,
    seq: int,
    head: int,
    record: FairKey | None,
    joins: int,
    low_seen: int | None,
) -> Placed:
    """Start-time fair queuing (place_ticket() with a fair key, lua/common_order.lua).

    A new waiter starts at max(head of the line, its key's tail); the tail then moves on
    one turn, FAIR_TURN / fair weight. So keys alternate (weight 3 takes three turns to
    one), a key alone takes every turn, and within a key tickets grow: FIFO. A key that
    joins the rotation gets the next tie (joins + 1, modulo TIE_BITS)."""
    existed = record is not None
    f = record or FairKey(tie=(joins + 1) % TIE_BITS)
    low = min(0, low_seen or 0, ask.priority)
    turn = FAIR_TURN / ask.fair_weight
    if urgent(ask.priority, low):
        start = max(head, f.urgent_tail)
        f = replace(f, urgent_tail=stored(start + turn), tail=stored(max(head, f.tail) + turn))
    else:
        start = max(head, f.tail)
        f = replace(f, tail=stored(start + turn))
    return Placed(
        ticket=math.floor(start) + f.tie,
        seq=seq,
        key=key,
        record=f,
        existed=existed,
        head=head,
        low=low,
    )


def roll_minute(grants: int, minute: int, before: int, now_ms: int) -> tuple[int, int, int]:
    """(this minute's count, this minute, the minute before's) after ``grants`` counted in
    ``minute`` and ``before`` in the one before: counts older than that are 0."""
    current = now_ms // 60_000
    if minute == current:
        return grants, minute, before
    return 0, current, grants if minute == current - 1 else 0


def recent(grants: int, minute: int, before: int, now_ms: int) -> int:
    """Grants of this minute and the minute before (60 to 120 s): what status shows."""
    now_count, _, previous = roll_minute(grants, minute, before, now_ms)
    return now_count + previous
