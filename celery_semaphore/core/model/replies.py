"""What the model answers: the values the scripts return (acquire.lua, acquire_all.lua,
enqueue.lua, claim.lua, status.lua) and the wake messages they publish, as named
fields, times on the semaphore's clock (ms, µs as named)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from .order import Asked
from .rate import Rate

if TYPE_CHECKING:  # parking.py answers with `Claimed`
    from .parking import Dispatch


class Declared(Enum):
    """A script that takes no rate from its caller (release, renew; configure and status
    when the caller has none) goes by the override, else the recorded rate."""

    NOTHING = "nothing"


NOTHING = Declared.NOTHING

#: The pause a client asks for after a data loss unless it sets one (its
#: ``pause_after_loss``: a quarter of the default 60 s lease, plus 0.5 s).
PAUSE_AFTER_LOSS_MS = 15_500


@dataclass(frozen=True)
class Caller:
    """What a client declares with its calls (effective_limit() in lua/common_meta.lua,
    effective_rate() in lua/common_rates.lua): its ``limit``, its ``rate`` (None: none),
    its ``shadow`` limits ('', 'l', 'r' or 'lr': they count and refuse nobody), how
    long a task published with a place counts as sent (``sent_horizon_ms``), for a
    client that publishes handovers its `Dispatch` (None: its calls hand over nobody),
    and the pause it asks for when it finds the data lost (``pause_ms``, the epoch
    argument's: the client's ``pause_after_loss``, a quarter of the default lease
    plus 0.5 s unless set)."""

    limit: int
    rate: Rate | None = None
    shadow: str = ""
    sent_horizon_ms: int = 3_600_000
    dispatch: Dispatch | None = None
    pause_ms: int = PAUSE_AFTER_LOSS_MS


@dataclass(frozen=True)
class Granted:
    """A permit (acquire.lua, code 1): its fencing ``token``, its lease's end, how long
    it waited in line, the shadow limits that would have refused it ('', 'l', 'r', 'lr')
    and by how many ms the shadow rate's slot was ahead."""

    token: int
    expires_ms: int
    waited_ms: int = 0
    shadow: str = ""
    shadow_wait_ms: int = 0


@dataclass(frozen=True)
class Refused:
    """A refusal (acquire.lua, code 0): ``ticket`` (0: not in line), ``position`` (1 +
    the waiters ahead), the permits held, the caller's effective limit, whether draining,
    the earliest holder lease end (0: no holder), µs until the rate allows it a grant
    (None: no rate), until when a RateLimited pause lasts (0: none), and until when
    admissions are paused after a data loss (0: they are not)."""

    ticket: int
    position: int
    holders: int
    limit: int
    draining: bool
    earliest_expiry_ms: int
    slot_us: int | None = None
    rate_pause_ms: int = 0
    resumes_ms: int = 0


@dataclass(frozen=True)
class Stale:
    """A stale copy of a handed-over waiter (acquire.lua, code 2): it changes nothing;
    ``token``: the handover token of the copy handed over last."""

    token: int


class Claimed(str, Enum):
    """Who a message taken from a parking queue is (claim.lua; `Parking.claim`), and
    so what the caller does with it."""

    PUBLISH = "publish"  # the turn handed over is its: publish it with the token
    STALE = "stale"  # a copy of it arrived, or it was served: drop it
    ABSENT = "absent"  # it is not parked here: publish it without a token
    VOID = "void"  # the handover is not the latest any more: put the message back


@dataclass(frozen=True)
class ParkedPlace:
    """Where a parked waiter stands (park.lua): its ticket and position in line."""

    ticket: int
    position: int


@dataclass(frozen=True)
class Enqueued:
    """A place taken without asking (enqueue.lua): as `Refused`, without the lease and
    pause fields; ``parked``: it was parked at once (its turn was far)."""

    ticket: int
    position: int
    holders: int
    limit: int
    draining: bool
    slot_us: int | None = None
    parked: bool = False


@dataclass(frozen=True)
class GrantedInPlace:
    """A wake message (grant_in_place()): a permit granted straight to ``holder``, a
    waiter in place ("g|<holder>|<token>|<expires ms>|<waited ms>")."""

    holder: str
    token: int
    expires_ms: int
    waited_ms: int


@dataclass(frozen=True)
class WakeUp:
    """A wake message (wake()): permits are free; the waiters up to ``ticket`` may be
    admitted now and should ask again (None: "inf", any waiter)."""

    ticket: int | None


@dataclass(frozen=True)
class Recall:
    """A wake message ("k"): the first waiter joined an empty line, so the processes
    that keep permits of this semaphore give back those idle now and the others when
    their tasks end (`SemaphoreModel.keep`). It admits nobody."""


#: What a call publishes on the semaphore's wake channel, in order.
Published = GrantedInPlace | WakeUp | Recall


@dataclass(frozen=True)
class HolderRow:
    holder: str
    token: int
    acquired_ms: int
    expires_ms: int
    info: str
    permits: int


@dataclass(frozen=True)
class WaiterRow:
    holder: str
    ticket: int
    since_ms: int
    expires_ms: int
    info: str
    #: Its recorded ask while any fair key has waiters (status.lua's weight text), else None.
    ask: Asked | None
    #: Its parked record's state: "p" parked, "h" handed over, else "" (asking itself).
    state: str = ""


@dataclass(frozen=True)
class SentRow:
    """A task published with a place that has not reached a worker, its place lapsed:
    when it was sent (ms)."""

    holder: str
    sent_ms: int


@dataclass(frozen=True)
class FairKeyRow:
    key: str
    waiting: int
    grants: int


@dataclass(frozen=True)
class Status:
    """status.lua's reading: live entries only (a run-out lease not yet reclaimed is left
    out of the lists and counts, but not of the fair keys' counts)."""

    now_ms: int
    recorded_limit: int | None
    override: int | None
    effective_limit: int
    draining: bool
    holder_count: int
    waiter_count: int
    holders: list[HolderRow]
    waiters: list[WaiterRow]
    parked_count: int
    handed_over_count: int
    sent_count: int
    sent_without_place: list[SentRow]
    rate: Rate | None
    rate_override: Rate | None
    rate_room: int
    next_start_ms: int
    rate_paused_until_ms: int
    fair_keys_waiting: int
    fair_grants: int
    fair_keys: list[FairKeyRow] = field(default_factory=list)
    shadow_limit_refusals: int = 0
    shadow_rate_refusals: int = 0
    shadow_wait_ms: int = 0
    shadow_peak: int = 0
    recorded_shadow: str = ""
    #: When admissions resume after a data loss (ms; 0: not paused).
    resumes_ms: int = 0
    #: How many tasks are sent without a place (the list may show fewer: status.lua
    #: lists at most STATUS_MOST); None: as many as listed.
    sent_without_place_count: int | None = None
    #: How many fair keys were read to find the busiest (None: every one).
    fair_keys_read: int | None = None


@dataclass(frozen=True)
class StaleCopy:
    """acquire_all.lua, code 2: a stale copy of a task that semaphore ``index`` handed
    over (``token``: its handover token of the copy handed over last)."""

    index: int
    token: int


@dataclass(frozen=True)
class RefusedAll:
    """acquire_all.lua, code 0: nothing granted anywhere. ``ticket``: the one ticket of
    every line it stands in (0: none); ``refused_by``: the semaphores that refused it;
    ``places``: its `Refused` in each (ticket 0 where it does not stand in line)."""

    ticket: int
    refused_by: tuple[int, ...]
    places: tuple[Refused, ...]
