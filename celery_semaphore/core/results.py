"""The values the semaphore's calls return: places in line, grants, status, counts.

Public types (exported by `celery_semaphore`), with no Redis in them: any store
returns these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .constants import KEPT_PREFIX
from .rates import RateLimit


@dataclass(frozen=True)
class Place:
    """A refused attempt: the contender's place in line.

    ``ticket`` can be stored and presented again (``attempt(ticket=...)``) to
    regain this place after a pause longer than the waiter lease; 0 means the
    attempt did not queue. ``next_expiry_in`` is the time until the earliest
    holder lease runs out (None if nobody holds a permit); ``hold_estimate`` a
    moving average of how long permits of this semaphore were held (None before
    the first release); ``grant_interval`` a moving average of the time between
    two grants while others waited (None before there was a line): the pace at
    which the line moves, measured on the server. ``resumes_in``: while no
    permit is granted after Redis lost its data, the time until admissions
    resume (None otherwise). ``rate_due``: under a rate, the time until the rate
    allows this place a grant (its slot, counting the places ahead of it; None
    without a rate); ``rate_paused_for``: while a task's `RateLimited` pauses the
    rate, the time until the pause ends (None otherwise). ``limit_binds``: see there.
    """

    ticket: int
    position: int
    holders: int
    limit: int
    draining: bool
    next_expiry_in: float | None
    hold_estimate: float | None = None
    grant_interval: float | None = None
    resumes_in: float | None = None
    rate_due: float | None = None
    rate_paused_for: float | None = None
    #: False where ``limit`` is a shadow limit: it refuses nobody, so nobody's turn
    #: depends on it (``rate_due`` and ``rate_paused_for`` are None for a shadow rate).
    limit_binds: bool = True


@dataclass(frozen=True)
class Places:
    """A refused attempt on a set of semaphores (`AsyncSemaphoreSet`): nothing was
    granted on any of them.

    ``ticket``: the contender's one ticket, the same in every line it stands in (0:
    not queued); present it again to keep its places. ``places``: its `Place` in each
    semaphore, in the set's order (ticket 0 where it does not stand in line);
    ``refused_by``: the indexes of the semaphores that refused it (the others would
    have admitted it).
    """

    ticket: int
    places: tuple[Place, ...]
    refused_by: tuple[int, ...]


@dataclass(frozen=True)
class HolderInfo:
    """A live holder. Times are the Redis server's, in seconds since the epoch;
    ``info`` is what the holder said of itself when it asked (a `LimitedTask`:
    JSON with its task name, worker and pid)."""

    holder: str
    fencing_token: int
    acquired_at: float
    expires_at: float
    info: str
    #: The permits it holds (its weight; 1 unless it asked for more).
    permits: int = 1


#: A waiter's state (`WaiterInfo.state`) by its parked record's letter, as every store
#: keeps it (common_parked.lua; the model's `Parking`): parked, handed over, waiting in
#: place, or none: asking itself.
WAITER_STATES = {"p": "parked", "h": "handed over", "w": "waiting in place", "": "asking"}


@dataclass(frozen=True)
class WaiterInfo:
    """A waiter in line. ``state``: ``"parked"`` (it left a payload and stopped
    asking), ``"handed over"`` (its payload was handed over to be published and
    has not arrived yet), ``"waiting in place"`` (blocked in `wait_for_turn()`:
    a release grants it the permit directly), or ``"asking"`` (it asks itself,
    or comes back after a countdown)."""

    holder: str
    ticket: int
    position: int
    since: float
    expires_at: float
    info: str
    state: str = "asking"
    #: The key whose turns it takes (``fair_key=``), or None.
    fair_key: str | None = None


@dataclass(frozen=True)
class FairKeyInfo:
    """A fair key with waiters in line (``fair_key=``): how many, and its grants in
    this minute and the minute before of the Redis server's clock (60 to 120 s).
    ``share``: those grants over all fair keys' in the same minutes (0.0 when none);
    a key's count restarts when its last waiter leaves the line (its record goes)."""

    key: str
    waiting: int
    grants: int
    share: float


@dataclass(frozen=True)
class Handover:
    """A parked waiter now due: publish ``payload`` so that it arrives presenting
    ``token`` (``attempt(holder, handover=token)``), ``delay`` seconds from now
    (under a rate: when its slot comes)."""

    holder: str
    token: int
    payload: str
    delay: float = 0.0


class Claimed(str, Enum):
    """What to do with a message taken from a parking queue (a broker queue where parked
    waiters' messages wait, in arrival order) by the process that got a `Handover` for
    that queue: `Semaphore.claim()`'s answer. The message taken may be another
    waiter's than the handover's: the queue hands out its head, the line goes by
    ticket."""

    PUBLISH = "publish"
    """Publish the message taken, carrying the handover's token: the turn is its now
    (when it is another waiter's, that waiter took the handover's place and the
    handover's waiter waits for the next)."""
    STALE = "stale"
    """Drop it: a copy of its task arrived already, or the task was served."""
    ABSENT = "absent"
    """Publish it without a token (its task is not parked here: it asks in person at a
    worker), and keep looking for the handover's message."""
    VOID = "void"
    """Put it back: the handover is not the latest of its waiter any more (handed over
    again, arrived, or gone)."""


@dataclass(frozen=True)
class Parked:
    """Where a parked waiter stands: its ``ticket`` and ``position`` in line."""

    ticket: int
    position: int


@dataclass(frozen=True)
class SemaphoreStatus:
    """One consistent reading of a semaphore (server time; lists capped at 1,000)."""

    name: str
    declared_limit: int | None
    override: int | None
    effective_limit: int
    draining: bool
    #: Permits in use: a holder of weight k counts k (``holders`` lists it once).
    holder_count: int
    waiter_count: int
    holders: list[HolderInfo]
    waiters: list[WaiterInfo]
    server_time: float
    parked_count: int = 0
    handed_over_count: int = 0
    #: Tasks published with a place in line that have not reached a worker yet:
    #: their messages wait in the broker. A place taken at publish lapses after a
    #: few seconds (so a lost message cannot block the line); these stay counted.
    sent_count: int = 0
    #: Those of them whose place lapsed (outside the line): state ``"in broker"``,
    #: ticket and position 0, oldest first (at most 1,000 listed).
    sent_without_place: list[WaiterInfo] = field(default_factory=list)
    #: How many of them there are (counted among the oldest 10,000 sent).
    sent_without_place_count: int = 0
    #: While no permit is granted after Redis lost its data: when admissions resume
    #: (server time); None otherwise.
    resumes_at: float | None = None
    #: The rate that applies (the override, else the one recorded by the last task
    #: that asked, or this client's), and the override; None: none.
    rate: RateLimit | None = None
    rate_override: RateLimit | None = None
    #: Under a rate: how many grants it allows now, and when the next one after
    #: those is allowed (server time).
    rate_room: int = 0
    next_start_at: float | None = None
    #: Until when the rate grants nothing after a task raised `RateLimited`; None: no pause.
    rate_paused_until: float | None = None
    #: Fair keys with waiters in line (``fair_key=``; 0: none, and nothing below is read).
    fair_keys_waiting: int = 0
    #: Grants to waiters of any fair key in this minute and the minute before (server clock).
    fair_grants: int = 0
    #: The 20 keys with the most waiting, most first (ties: more grants first). Read from
    #: a bounded sample when there are many: a scan of the meta hash that examines about
    #: 4,000 fields (``fair_keys_read`` < ``fair_keys_waiting``: the sample missed some).
    fair_keys: list[FairKeyInfo] = field(default_factory=list)
    fair_keys_read: int = 0
    #: What its shadow limits (``shadow=``) counted: grants the concurrency limit would
    #: have refused, grants the rate would have delayed and by how long in all (seconds),
    #: and the most permits held at once over the limit (the peak it would have had to
    #: allow; 0: never over). Counted since the semaphore's keys were made.
    shadow_limit_refusals: int = 0
    shadow_rate_refusals: int = 0
    shadow_delay: float = 0.0
    shadow_peak: int = 0
    #: The limits its tasks declare as shadow limits ("limit", "rate"), as the last
    #: task to ask recorded them: what the counts above count from now on (empty:
    #: every limit is enforced now, and the counts are from before).
    shadow: frozenset[str] = frozenset()

    @property
    def kept_count(self) -> int:
        """Of ``holder_count``, the permits worker processes keep between tasks (idle,
        or running the process's next task: `celery_semaphore.kept_permits`), as far
        as ``holders`` lists them."""
        return kept_permits(self.holders)


@dataclass(frozen=True)
class SemaphoreCounts:
    """What a metrics scrape reads of one semaphore (counts.lua): the figures of
    `SemaphoreStatus` without its lists, each as `status()` reports it to a caller
    that declares no limit and no rate (the CLI's, the metrics'), in O(log n) Redis
    work, and the ``meta`` fields asked for (absent ones: '')."""

    name: str
    declared_limit: int | None
    effective_limit: int
    draining: bool
    holder_count: int
    waiter_count: int
    server_time: float
    parked_count: int
    handed_over_count: int
    sent_count: int
    rate: RateLimit | None
    rate_paused_until: float | None
    fair_keys_waiting: int
    #: Of ``holder_count``, the permits worker processes keep between tasks.
    kept_count: int
    fields: dict[str, str]


@dataclass(frozen=True)
class Grant:
    """The fields of a granted reply, before a permit object wraps them."""

    fencing_token: int
    expires_at: float
    waited: float
    #: The shadow limits that would have refused it ("limit", "rate"), and by how much
    #: the shadow rate's slot was ahead (seconds).
    shadow_refused: frozenset[str] = frozenset()
    shadow_wait: float = 0.0


SHADOW_CODES = {"l": "limit", "r": "rate"}


def shadow_kinds(codes: str) -> frozenset[str]:
    """The scripts' shadow codes ('', 'l', 'r', 'lr') as kinds; a code this version does
    not know (a later one's) is left out."""
    return frozenset(SHADOW_CODES[code] for code in codes if code in SHADOW_CODES)


@dataclass(frozen=True)
class DataLoss:
    """Redis at ``url`` lost the data this process had seen there.

    Times are the Redis server's (seconds since the epoch): ``lost_at`` when a
    client first noticed (0 if nobody that knew the data has noticed yet: then
    nothing was paused), ``resumes_at`` when admissions resume (no permit is
    granted before: the workers write back the permits of the tasks they run
    meanwhile), ``noticed_at`` when this process noticed.
    """

    url: str
    epoch_key: str
    lost_at: float
    resumes_at: float
    noticed_at: float

    @property
    def pause(self) -> float:
        """How long admissions are paused, in seconds."""
        return max(0.0, self.resumes_at - self.lost_at) if self.lost_at else 0.0


@dataclass(frozen=True)
class Persistence:
    """Whether a store keeps every write across a restart: ``every_write`` True (Redis:
    ``appendonly yes`` on every node asked), False (not somewhere), None (it would not
    say: ``detail`` says why)."""

    every_write: bool | None
    detail: str


def kept_permits(holders: list[HolderInfo]) -> int:
    """The permits of ``holders`` kept by worker processes between tasks."""
    return sum(h.permits for h in holders if h.holder.startswith(KEPT_PREFIX))
