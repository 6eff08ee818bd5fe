"""Several semaphores at once (acquire_all.lua): a permit on every one, or on none.

Each semaphore is weighed exactly as a lone attempt weighs it (the gates of
`SemaphoreModel`: reclaim, limits, rate, drain, the pause after a data loss, weights,
shadow limits, a live permit held already); then all grant, or none does.

Why: a contender that needs several limits at once must not hold one while it waits
for another (two such contenders could each hold what the other waits for). Refused,
it stands in line with ONE ticket in every semaphore that refused it, so two
contenders stand in the same order in every line they share, and none waits for a
later one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from celery_semaphore.core.constants import PRIORITY_STEP

from .order import PLAIN_ASKED, Asked, seq_after
from .parking import Arrival
from .replies import Caller, Granted, Refused, RefusedAll, StaleCopy
from .semaphore import Gate, SemaphoreModel


@dataclass(frozen=True)
class Part:
    """One semaphore of a set and what the contender declares there (acquire_all.lua's
    ARGV per semaphore): its caller, the lease of a permit, its waiter lease (0: it does
    not queue there), its ask. The models of a set share one `Epochs` (one Redis)."""

    model: SemaphoreModel
    caller: Caller
    lease_ms: int
    waiter_lease_ms: int
    ask: Asked = PLAIN_ASKED


def one_ticket(parts: Sequence[Part], gates: Sequence[Gate]) -> tuple[int | None, int | None]:
    """The contender's one ticket: the smallest of the one presented and its places in
    these lines; with a fair key in one semaphore, its place in that line (or the one
    presented) alone: the others (a place taken at publish, in time) would put it out
    of its key's turn. And the index of that semaphore, if any."""
    fair = next((i for i, part in enumerate(parts) if part.ask.fair_key is not None), None)
    if fair is not None:
        return gates[fair].ticket, fair
    tickets = [g.ticket for g in gates if g.ticket is not None]
    return min(tickets, default=None), None


def acquire_all(
    parts: Sequence[Part],
    holder: str,
    now_us: int,
    *,
    hold_back_ms: int = 0,
    ticket: int | None = None,
    info: str = "",
    handover: tuple[int, int] | None = None,
) -> list[Granted] | RefusedAll | StaleCopy:
    """A permit on every semaphore of ``parts`` if each admits the contender now (new
    fencing tokens, the rates' grants spent, its places left), else nothing anywhere
    (no permit, no rate grant spent) and `RefusedAll`.

    Refused, it stands in line in each semaphore that refused it (with that one's
    waiter lease), and, for ``hold_back_ms``, in those that would have admitted it
    (a waiter keeps the permit it will need there from later contenders); without
    ``hold_back_ms`` it leaves their lines, so it holds back nobody where it could have
    been served; where it holds a permit already it stands in no line. Its ticket:
    `one_ticket`, else one new ticket after every semaphore's ticket sequence (at its
    key's turn in the line of its fair key; else moved by its priority, the same in
    every line), taken only if refused while queueing. ``handover``: (the index of the
    semaphore that handed it over, the token): a stale copy changes nothing. It is never
    marked waiting in place: a release of one semaphore could not grant it the others."""
    for part in parts:
        part.model.begin(part.caller.pause_ms, now_us)
    if handover is not None:
        by, token = handover
        parking = parts[by].model.parking
        if parking.arrive(holder, token, now_us // 1000) is Arrival.STALE:
            return StaleCopy(by, parking.records[holder].token)
    came_by: list[int | None] = [None] * len(parts)
    if handover is not None:
        came_by[handover[0]] = handover[1]
    gates = [
        part.model.open_gate(part.caller, holder, ticket, came_by[i], now_us)
        for i, part in enumerate(parts)
    ]
    taken, fair = one_ticket(parts, gates)
    seq = max(seq_after(part.model.ticket, now_us) for part in parts)
    placed = taken
    if placed is None and fair is not None:
        placed = parts[fair].model.place(parts[fair].ask, now_us).ticket
    elif placed is None:
        placed = seq - parts[0].ask.priority * PRIORITY_STEP
    for part, gate in zip(parts, gates, strict=True):
        gate.judged = part.model.judge(
            part.caller, part.ask, placed, held=gate.holding is not None, now_us=now_us
        )
    admitted = all(gate.judged is not None and gate.judged.admitted for gate in gates)
    if not admitted and taken is None and any(part.waiter_lease_ms > 0 for part in parts):
        for i, part in enumerate(parts):
            if i == fair:
                part.model.new_ticket(part.ask, now_us)
            else:
                part.model.ticket = seq
        taken = placed
    rows: list[Granted | Refused] = []
    for part, gate in zip(parts, gates, strict=True):
        row = joint_row(part, gate, taken, admitted=admitted, hold_back_ms=hold_back_ms,
                        info=info, now_us=now_us)  # fmt: skip
        rows.append(row)
        part.model.handovers = part.model.finish_gate(part.caller, gate, now_us)
    if admitted:
        return [row for row in rows if isinstance(row, Granted)]
    refused_by = tuple(i for i, g in enumerate(gates) if g.judged and not g.judged.admitted)
    places = tuple(row for row in rows if isinstance(row, Refused))
    return RefusedAll(taken or 0, refused_by, places)


def joint_row(
    part: Part,
    gate: Gate,
    ticket: int | None,
    *,
    admitted: bool,
    hold_back_ms: int,
    info: str,
    now_us: int,
) -> Granted | Refused:
    """One semaphore's outcome: granted when all admit; else it stands in line where it
    was refused, is held back where it would have been admitted (only while it queues
    there and holds no permit), or leaves the line."""
    model, caller, ask = part.model, part.caller, part.ask
    if admitted:
        return model.grant(caller, gate, ask=ask, info=info, lease_ms=part.lease_ms, now_us=now_us)
    assert gate.judged is not None
    lease_ms = part.waiter_lease_ms
    if gate.judged.admitted:
        lease_ms = hold_back_ms if part.waiter_lease_ms > 0 and gate.holding is None else 0
        if lease_ms == 0:
            model.leave_gate(gate)
    return model.refuse(
        caller, gate, ticket, ask=ask, info=info, waiter_lease_ms=lease_ms, now_us=now_us
    )
