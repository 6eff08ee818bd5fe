"""The PostgreSQL store: each request one call of a function in the database.

What is here and nowhere else: the connection (made at the first call, the functions
installed then if missing: `celery_semaphore.core.postgres.schema`), the arguments
each function takes, and the waiters' LISTEN connection. The rules are in the
functions (``sql/functions.sql``), which follow the reference model.

``core/postgres/_async/store.py`` is the source; ``core/postgres/_sync/store.py`` is
generated from it (``scripts/unasync.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import time
from collections.abc import Iterator, Sequence
from typing import Any

from celery_semaphore.core.constants import ANY_CHANNEL
from celery_semaphore.core.errors import SemaphoreConnectionError, StaleHandover
from celery_semaphore.core.model.replies import Granted
from celery_semaphore.core.postgres import replies
from celery_semaphore.core.postgres.connection import (
    SERVER_PID,
    STATEMENT_POOLING,
    UNREADABLE,
    behind_pooler,
    check_url,
    connect_async,
    connection_trouble,
    is_postgres_url,
    needs_psycopg,
    say_polling,
    shown,
    translate,
)
from celery_semaphore.core.postgres.schema import FUNCTIONS, install_async
from celery_semaphore.core.protocol import FAIR_TOP, STATUS_MOST, SemaphoreSpec
from celery_semaphore.core.readings import enqueued_place, grant_of, place_of, semaphore_status
from celery_semaphore.core.redis import wake_messages
from celery_semaphore.core.requests import (
    Acquire,
    AcquireAll,
    Claim,
    Configure,
    Enqueue,
    Park,
    Release,
    Renew,
)
from celery_semaphore.core.results import (
    Claimed,
    Grant,
    Handover,
    Parked,
    Place,
    Places,
    SemaphoreStatus,
)

#: How often a call is asked again after its connection failed (`backoff`), as
#: redis-py's default client retries the Redis store's calls.
RETRIES = 10


def backoff(retries: int) -> Iterator[float | None]:
    """The pauses between the tries of a call, then None after the last: exponential
    with full jitter, from 10 ms to at most 1 s (redis-py's
    ``ExponentialWithJitterBackoff(cap=1, base=0.01)``), about 2-4 s in all."""
    for attempt in range(retries):
        yield random.uniform(0, min(1.0, 0.01 * 2**attempt))
    yield None


#: Rounds of `AsyncPostgresStore.transaction_pooled`: each a statement on the store's
#: connection and one on the listener.
PROBE_ROUNDS = 3

#: Connections a forked child inherited: never used, never closed (closing would end
#: the parent's session on the shared socket).
_INHERITED: list[Any] = []


def channel_of(spec: SemaphoreSpec) -> str:
    """The channel the semaphore's waiters LISTEN on (channel() in functions.sql)."""
    return "cs_" + hashlib.md5(f"{spec.namespace}/{spec.name}".encode()).hexdigest()


def _call(function: str, arguments: int) -> str:
    return f"SELECT {FUNCTIONS}.{function}({', '.join(['%s'] * arguments)})"


ACQUIRE = _call("acquire", 22)
ACQUIRE_ALL = _call("acquire_all", 24)
ENQUEUE = _call("enqueue", 23)
PARK = _call("park", 16)
CLAIM = _call("claim", 5)
DISPATCH = _call("dispatch", 4)
RELEASE = _call("release", 10)
RENEW = _call("renew", 6)
CONFIGURE = _call("configure", 8)
STATUS = _call("status", 8)


def rate_of(spec: SemaphoreSpec) -> tuple[int | None, int | None]:
    """The semaphore's rate as the functions take it: (interval µs, burst), or NULLs."""
    rate = spec.rate
    return (None, None) if rate is None else (rate.interval_us, rate.burst)


def cfg_of(spec: SemaphoreSpec) -> list[int] | None:
    """The semaphore's `Dispatch` as the functions take it (``cfg``): [max_block ms,
    deadline ms, lead ms], or None where this client publishes no handovers."""
    cfg = spec.dispatch
    return None if cfg is None else [cfg.max_block_ms, cfg.deadline_ms, cfg.lead_ms]


class Polling:
    """The subscription of a waiter in place that no notification can reach: its
    store is behind a pooler in transaction (or statement) mode, found when its first
    listener connected (`AsyncPostgresStore.transaction_pooled`). There each statement
    runs on whichever server connection the pool hands out, so a LISTEN registers on a
    server connection the waiter no longer holds, and the NOTIFYs meant for it reach no
    one or another client (measured on PgBouncer 1.18). The waiter opens no listener:
    it sleeps its pause (``recheck_interval`` at most, less before a lease ends) and
    asks again. A permit released to it meanwhile waits for that ask.

    Why poll rather than refuse: the cap, the order and the leases hold as they do
    with LISTEN (they are in the database); only the wake-up is slower. A refusal would
    surface only when a semaphore is contended, at the busiest hour, as tasks failing
    or retrying with an error each; a Celery user expects what Celery does itself where
    a backend cannot push (``result.get()``, a chord's ``chord_unlock``): poll, and say
    so once. The WARNING (`say_polling`, once per URL and process) names the fix."""

    def __repr__(self) -> str:
        return "<polling: no LISTEN through a transaction-pooling pooler>"


POLLING = Polling()

NOTE_LOST = (
    "UPDATE celery_semaphore.semaphores SET lost_noted = lost_noted + %s "
    "WHERE namespace = %s AND name = %s"
)


class AsyncPostgresStore:
    """Semaphores in one PostgreSQL database (`celery_semaphore.core._async.store.AsyncStore`).

    ``url``: ``postgresql://user:password@host:port/database?sslmode=...`` (libpq's
    settings in the query). One connection per process, made at the first call; a
    waiter in place listens on a connection of its own. ``retries``: how often a call
    whose connection failed is asked again (0: never, for callers that must not stall:
    a publisher)."""

    def __init__(self, url: str, *, retries: int = RETRIES) -> None:
        if not is_postgres_url(url):
            raise ValueError(f"a PostgreSQL URL starts with postgresql://, got {shown(url)!r}")
        check_url(url)
        needs_psycopg()
        #: The URL as given (with its password: never shown; ``url`` is).
        self.target = url
        self.url = shown(url)
        self.retries = retries
        self._connection: Any = None
        self._pid = os.getpid()
        #: A LISTEN connection kept from the last wait that ended normally.
        self._spare: Any = None
        #: Whether waiters poll (`Polling`): a pooler in transaction mode was found.
        self._polling = False

    def __repr__(self) -> str:
        return f"AsyncPostgresStore({self.url!r})"

    async def _connected(self) -> Any:
        if self._pid != os.getpid():  # a forked child: its own connections
            _INHERITED.extend(c for c in (self._connection, self._spare) if c is not None)
            self._connection = self._spare = None
            self._pid = os.getpid()
        if self._connection is None or self._connection.closed:
            connection = await connect_async(self.target)
            try:
                await install_async(connection, self.url)
            except needs_psycopg().Error as error:  # cut off, or a read-only standby
                await connection.close()
                raise translate(error, self.url) from error
            except BaseException:
                await connection.close()
                raise
            current = self._connection
            if current is not None and not current.closed:  # another thread or task connected
                await connection.close()  # meanwhile: one connection, none dropped open
                return current
            self._connection = connection
        return self._connection

    async def _one(self, query: str, arguments: Sequence[Any]) -> Any:
        """The one value ``query`` answers. A connection lost (the database restarted,
        its backend was terminated) or not made is dropped, and the call asked again on
        a new one, after backing off (`backoff`), as redis-py's default client does for
        the Redis store: a database that answers again within a second or two loses no
        call. Then the failure is raised as `SemaphoreConnectionError`; wrong credentials
        or a missing database at once.

        Why ask again: a worker's first call after a restart is often a release, and a
        release that fails leaves its permit held until the lease runs out. It is safe:
        a connection found lost at a call's start never ran it, and if it was lost after
        the call committed, every operation asked twice answers as asked once (a release
        or renew of what is done, the same holder's place or permit again) or is handed
        over again at its deadline (a claim)."""
        for pause in backoff(self.retries):
            try:
                return await self._ask(query, arguments)
            except SemaphoreConnectionError as error:
                if not self.reconnectable(error) or pause is None:
                    raise
            await asyncio.sleep(pause)
        raise AssertionError("unreachable: the last try returns or raises")

    async def _ask(self, query: str, arguments: Sequence[Any]) -> Any:
        """One try of `_one`: a connection in trouble is dropped."""
        psycopg = needs_psycopg()
        connection = await self._connected()
        try:
            cursor = await connection.execute(query, arguments)
            row = await cursor.fetchone()
        except psycopg.Error as error:
            if connection_trouble(error):
                self._connection = None
                await connection.close()
            raise translate(error, self.url) from error
        return None if row is None else row[0]

    async def acquire(
        self, spec: SemaphoreSpec, request: Acquire
    ) -> tuple[Grant | Place, list[Handover]]:
        ask = request.ask
        row, handed = await self._one(ACQUIRE, (
            spec.namespace, spec.name, request.holder, spec.limit, request.lease_ms,
            request.wait_ms, request.ticket, request.info, spec.idle_ms, request.in_place,
            spec.family, spec.shadow_codes, ask.text, ask.permits, ask.grants, ask.priority,
            *rate_of(spec), ask.fair_key, ask.fair_weight, request.handover, cfg_of(spec),
        ))  # fmt: skip
        if row[0] == 2:
            raise StaleHandover(spec.name, row[1])
        result, now_ms, hold_ms = replies.acquired(row)
        handovers = replies.handovers(handed)
        if isinstance(result, Granted):
            return grant_of(result), handovers
        return place_of(result, now_ms, hold_ms=hold_ms), handovers

    async def acquire_all(
        self, specs: Sequence[SemaphoreSpec], request: AcquireAll
    ) -> tuple[list[Grant] | Places, list[list[Handover]]]:
        asks, rates = request.asks, [rate_of(spec) for spec in specs]
        came_by = request.came_by
        cfgs = [spec.dispatch for spec in specs]
        reply = await self._one(ACQUIRE_ALL, (
            specs[0].namespace, [spec.name for spec in specs], request.holder,
            request.ticket, request.hold_ms, request.info, [spec.limit for spec in specs],
            list(request.lease_ms), list(request.wait_ms), [spec.idle_ms for spec in specs],
            [spec.family for spec in specs], [spec.shadow_codes for spec in specs],
            [ask.text for ask in asks], [ask.permits for ask in asks],
            [ask.grants for ask in asks], [ask.priority for ask in asks],
            [interval for interval, _ in rates], [burst for _, burst in rates],
            [ask.fair_key for ask in asks], [ask.fair_weight for ask in asks],
            None if came_by is None else [came_by[0] + 1, came_by[1]],
            [None if cfg is None else cfg.max_block_ms for cfg in cfgs],
            [None if cfg is None else cfg.deadline_ms for cfg in cfgs],
            [None if cfg is None else cfg.lead_ms for cfg in cfgs],
        ))  # fmt: skip
        if reply[0] == 2:
            _, index, token = reply
            raise StaleHandover(specs[index].name, token)
        handovers = [replies.handovers(handed) for handed in reply[-1]]
        if reply[0] == 1:
            grants = [grant_of(replies.acquired(row)[0]) for row in reply[1]]  # type: ignore[arg-type]
            return grants, handovers
        _, ticket, refused_by, rows, _ = reply
        places = []
        for row in rows:
            refused, now_ms, hold_ms = replies.acquired(row)
            places.append(place_of(refused, now_ms, hold_ms=hold_ms))  # type: ignore[arg-type]
        return Places(ticket, tuple(places), tuple(refused_by)), handovers

    def joint_problem(self, members: Sequence[tuple[Any, SemaphoreSpec]]) -> str | None:
        """Why these semaphores cannot be taken in one call here, or None: they must be
        in this database, in one namespace, with distinct names."""
        first = members[0][1]
        for store, spec in members[1:]:
            if getattr(store, "target", None) != self.target:
                return (
                    f"semaphores must share one store (one PostgreSQL URL): {first.name!r} "
                    f"is on {self.url}, {spec.name!r} on {store.url}"
                )
            if spec.namespace != first.namespace:
                return (
                    f"semaphores must share one namespace: {first.name!r} is in "
                    f"{first.namespace!r}, {spec.name!r} in {spec.namespace!r}"
                )
        names = [spec.name for _, spec in members]
        if len(set(names)) < len(names):
            twice = sorted({name for name in names if names.count(name) > 1})
            return f"semaphores must have distinct names; given twice: {', '.join(twice)}"
        return None

    async def park(self, spec: SemaphoreSpec, request: Park) -> tuple[Parked, list[Handover]]:
        ask = request.ask
        ticket, position, handed = await self._one(PARK, (
            spec.namespace, spec.name, request.holder, request.ticket, request.payload,
            request.park_ms, request.info, spec.idle_ms, request.due_ms,
            None if ask is None else ask.text, None if ask is None else ask.permits,
            None if ask is None else ask.grants, None if ask is None else ask.priority,
            None if ask is None else ask.fair_key, None if ask is None else ask.fair_weight,
            cfg_of(spec),
        ))  # fmt: skip
        return Parked(ticket, position), replies.handovers(handed)

    async def claim(self, spec: SemaphoreSpec, request: Claim) -> Claimed:
        reply = await self._one(
            CLAIM, (spec.namespace, spec.name, request.taken, request.handed, request.token)
        )
        return Claimed(reply)

    async def list_parked(self, spec: SemaphoreSpec) -> None:
        """Nothing to list: the workers find the semaphores with parked waiters with a
        query of the ``parked`` table (`celery_semaphore.core.postgres.operations`)."""

    async def enqueue(
        self, spec: SemaphoreSpec, request: Enqueue
    ) -> tuple[Place, bool, list[Handover]]:
        ask, far = request.ask, request.far
        reply = await self._one(ENQUEUE, (
            spec.namespace, spec.name, request.holder, spec.limit, request.wait_ms,
            request.info, spec.idle_ms, spec.shadow_codes, ask.text, ask.permits,
            ask.grants, ask.priority, spec.sent_horizon_ms, *rate_of(spec), ask.fair_key,
            ask.fair_weight, None if far is None else far.window_us,
            None if far is None else far.head, None if far is None else far.tail,
            None if far is None else far.park_ms, None if far is None else far.due_ms,
            cfg_of(spec),
        ))  # fmt: skip
        place = replies.enqueued(reply)
        return enqueued_place(place), place.parked, replies.handovers(reply[-1])

    async def dispatch(self, spec: SemaphoreSpec, drop: tuple[str, ...]) -> list[Handover]:
        """Declares no limit: the heartbeat calls it on semaphores it knows by name."""
        _, handed = await self._one(DISPATCH, (spec.namespace, spec.name, list(drop), cfg_of(spec)))
        return replies.handovers(handed)

    async def release(self, spec: SemaphoreSpec, request: Release) -> tuple[int, list[Handover]]:
        released, handed = await self._one(RELEASE, (
            spec.namespace, spec.name, request.holder, request.token, spec.limit,
            spec.shadow_codes, request.unused, cfg_of(spec), request.keep_as,
            request.keep_info,
        ))  # fmt: skip
        return int(released), replies.handovers(handed)

    async def renew(
        self, spec: SemaphoreSpec, request: Renew
    ) -> tuple[float, set[str], list[Handover], int]:
        holders = [holder for holder, _, _ in request.held]
        tokens = [token for _, token, _ in request.held]
        reply = await self._one(
            RENEW, (spec.namespace, spec.name, holders, tokens, request.lease_ms, cfg_of(spec))
        )
        expires_ms, lost, handed = reply
        return expires_ms / 1000, set(lost), replies.handovers(handed), 0

    async def configure(
        self, spec: SemaphoreSpec, request: Configure
    ) -> tuple[str | None, list[Handover]]:
        previous, handed = await self._one(CONFIGURE, (
            spec.namespace, spec.name, request.field, request.value, spec.idle_ms,
            *rate_of(spec), cfg_of(spec),
        ))  # fmt: skip
        return previous, replies.handovers(handed)

    async def status(self, spec: SemaphoreSpec) -> SemaphoreStatus:
        reply = await self._one(STATUS, (
            spec.namespace, spec.name, spec.limit, spec.sent_horizon_ms, STATUS_MOST,
            *rate_of(spec), FAIR_TOP,
        ))  # fmt: skip
        return semaphore_status(spec.name, replies.status(reply))

    async def learn_epoch(self, spec: SemaphoreSpec) -> None:
        """PostgreSQL keeps what it committed (its WAL): there is no data loss to notice."""

    async def note_lost(self, spec: SemaphoreSpec, count: int) -> None:
        await self._one(NOTE_LOST + " RETURNING 1", (count, spec.namespace, spec.name))

    # Waiting in place: LISTEN on a connection of its own --------------------------------

    async def listen(self, specs: Sequence[SemaphoreSpec]) -> Any:
        """A connection that LISTENs on the semaphores' channels (the one kept from the
        last wait, else a new one), or `POLLING` behind a pooler in transaction mode:
        found once, when a new listener connects behind a pooler."""
        if self._polling:
            return POLLING
        listener, self._spare = self._spare, None
        try:
            if listener is None or listener.closed or self._pid != os.getpid():
                listener = await connect_async(self.target)
                if behind_pooler(listener) and await self.transaction_pooled(listener):
                    self._polling = True
                    say_polling(self.url)
                    await listener.close()
                    return POLLING
            for spec in specs:
                await listener.execute(f'LISTEN "{channel_of(spec)}"')
        except BaseException as error:
            if listener is not None:
                await listener.close()
            if isinstance(error, needs_psycopg().Error):
                raise translate(error, self.url) from error
            raise
        return listener

    async def transaction_pooled(self, listener: Any) -> bool:
        """Whether the pooler in front of the store (`behind_pooler`) pools by
        transaction (or by statement), not by session: from the server processes that
        run the store's connection's statements and the new ``listener``'s, in turns.
        Pooled by session, each connection has a server of its own until it
        disconnects; pooled by transaction, each statement gets whichever is free::

            store's:   SELECT pg_backend_pid() -> p1    session: p1, always
            listener:  SELECT pg_backend_pid() -> p1    transaction: the server used
                                                        last (PgBouncer's default), or
                                               -> p2    another, if a client took p1
            store's:   SELECT pg_backend_pid() -> p2    ... then p2 is the one used last

        Transaction pooling is certain once a connection's statements ran on two
        servers or both connections' on one; `PROBE_ROUNDS` rounds at most. Measured on
        PgBouncer 1.18, with and without ``server_round_robin``, up to 40 clients busy
        on the pool: found in 100 tries of 100; session pooling never taken for it.
        Once per listener connection behind a pooler, never on a call."""
        connection = await self._connected()
        mine: set[Any] = set()
        theirs: set[Any] = set()
        for _ in range(PROBE_ROUNDS):
            mine.add(await (await connection.execute(SERVER_PID)).fetchone())
            theirs.add(await (await listener.execute(SERVER_PID)).fetchone())
            if len(mine) > 1 or len(theirs) > 1 or mine & theirs:
                return True
        return False

    async def wait_for_wakeup(
        self, subscription: Any, ticket: int, holder: str, seconds: float
    ) -> Grant | None:
        """Until a notification that may admit ``ticket`` or grants ``holder`` its permit
        in place, or ``seconds`` pass (then a round trip checks the connection is alive).
        `POLLING`: ``seconds``."""
        if subscription is POLLING:
            await asyncio.sleep(seconds)
            return None
        psycopg = needs_psycopg()
        deadline = time.monotonic() + seconds
        try:
            while (left := deadline - time.monotonic()) > 0:
                async for notify in subscription.notifies(timeout=left):
                    message = {"data": notify.payload}
                    grant = wake_messages.grant_in(message, holder)
                    if grant is not None:
                        return grant
                    if wake_messages.admits(message, ticket):
                        return None
            await subscription.execute("SELECT 1")
        except psycopg.Error as error:
            raise translate(error, self.url) from error
        return None

    async def wait_for_message(self, subscription: Any, seconds: float) -> str | None:
        """`POLLING` (no LISTEN through this pooler) hears nothing: `ANY_CHANNEL` after
        ``seconds``, so a process gives its kept permits back rather than keep them past
        a line."""
        if subscription is POLLING:
            await asyncio.sleep(seconds)
            return ANY_CHANNEL
        psycopg = needs_psycopg()
        try:
            async for notify in subscription.notifies(timeout=seconds):
                return str(notify.channel)
        except psycopg.Error as error:
            raise translate(error, self.url) from error
        return None

    def wake_channel(self, spec: SemaphoreSpec) -> str:
        return channel_of(spec)

    async def unlisten(self, subscription: Any, *, keep: bool) -> None:
        """Keep the connection for the next wait (after UNLISTEN), or close it. None:
        `listen` failed (the database is away), nothing to close; `POLLING`: none."""
        if subscription is None or subscription is POLLING:
            return
        if keep and self._spare is None and not subscription.closed:
            try:
                await subscription.execute("UNLISTEN *")
            except needs_psycopg().Error:
                await subscription.close()
                return
            self._spare = subscription
            return
        await subscription.close()

    def reconnectable(self, error: SemaphoreConnectionError) -> bool:
        """Whether asking again may help: not with wrong credentials, a missing
        database, a URL libpq cannot read or functions to install through PgBouncer in
        statement mode."""
        text = str(error)
        fixed = ("credentials", "does not exist", UNREADABLE, STATEMENT_POOLING)
        return not any(reason in text for reason in fixed)

    async def aclose(self) -> None:
        for connection in (self._connection, self._spare):
            if connection is not None and self._pid == os.getpid():
                await connection.close()
        self._connection = self._spare = None
