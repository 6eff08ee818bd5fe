"""`Operator`: the app's semaphores as the CLI sees them, those in Redis and those
the app declares, opened by name or by per-key family, with "did you mean" when a
name is neither."""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import click

from celery_semaphore.config import get_config
from celery_semaphore.core import Semaphore
from celery_semaphore.core.errors import UnknownSemaphore
from celery_semaphore.core.operations import open_semaphore, operated_store
from celery_semaphore.core.postgres.connection import is_postgres_url
from celery_semaphore.core.protocol import PAUSE_MARGIN
from celery_semaphore.core.rates import RateLimit
from celery_semaphore.durability import Where
from celery_semaphore.gates import QUEUE_PREFIX
from celery_semaphore.state import state_of

from . import rows
from .errors import prog


@dataclass(frozen=True)
class InApp:
    """What the app declares for one semaphore: its limit and its rate (either may be None)."""

    limit: int | None
    rate: RateLimit | None


class Operator:
    """The app's semaphores as the CLI sees them."""

    def __init__(self, app: Any, prog: str = "celery semaphore") -> None:
        config = get_config(app)
        self.app = app
        self.prog = prog
        self.namespace = config.namespace
        self.queue_limits = dict(config.queue_limits)
        self.queue_rates = dict(config.queue_rates)
        self.store = operated_store(config.redis_url)
        self.url = self.store.url
        #: Where the semaphores live, in messages.
        self.kind = "PostgreSQL" if is_postgres_url(config.redis_url) else "Redis"
        # A command that notices a loss of Redis's data pauses admissions as the
        # app's workers would (see celery_semaphore.core.redis.epochs).
        self.pause_after_loss = config.renew_every + PAUSE_MARGIN
        self._declared: dict[str, InApp] | None = None

    def parked_in(self) -> str:
        """Where this app's parked tasks' messages wait (`durability.Where`), in words."""
        in_broker = state_of(self.app).parking.in_broker(self.app, get_config(self.app))
        return (Where.BROKER if in_broker else Where.STORE).in_words(self.kind)

    def names(self) -> list[str]:
        return self.store.semaphore_names(self.namespace)

    def declared(self) -> dict[str, InApp]:
        """The semaphores this app declares, with their limits and rates: the static
        names of its tasks' limits and ``queue:<name>`` for its queue caps and rates
        (per-key names, from a key function, are known only once used)."""
        if self._declared is None:
            declared = {
                QUEUE_PREFIX + q: InApp(limit, None) for q, limit in self.queue_limits.items()
            }
            for queue, rate in self.queue_rates.items():
                limit = declared.get(QUEUE_PREFIX + queue, InApp(None, None)).limit
                declared[QUEUE_PREFIX + queue] = InApp(limit, rate)
            with suppress(Exception):  # the tasks that -A imported still count
                self.app.loader.import_default_modules()
            for task in list(self.app.tasks.values()):
                declared.update(_declared_by(task))
            self._declared = declared
        return self._declared

    def in_app(self, name: str) -> InApp:
        """What the app declares for ``name`` (nothing: None and None)."""
        return self.declared().get(name, InApp(None, None))

    def open_all(self) -> list[Semaphore]:
        """Every semaphore in Redis and every one the app declares (less those whose
        keys went, or that have neither a declared limit nor an override, between
        listing and opening)."""
        opened = []
        for name in sorted(set(self.names()) | set(self.declared())):
            with suppress(UnknownSemaphore):
                opened.append(self.open(name, suggest=False))
        return opened

    def open(self, name: str, *, suggest: bool = True) -> Semaphore:
        """Semaphore ``name``: one that has been used, or whose limit was set
        before its first use, or that the app declares (with that limit, and
        nothing held, before its first use). It publishes no task: the parked
        tasks its changes make due are handed over by the workers (see `wake`),
        which publish to the broker they really use (this command's app may not
        be configured with it)."""
        try:
            return open_semaphore(
                self.store,
                self.namespace,
                name,
                override_only=True,
                pause_after_loss=self.pause_after_loss,
            )
        except UnknownSemaphore:
            if name in self.declared():
                in_app = self.declared()[name]
                return self.open_new(name, in_app.limit, in_app.rate)
            if not suggest:
                raise
            members = self.family(name)
            if members:
                raise click.ClickException(self.one_at_a_time(name, members)) from None
            raise click.ClickException(self.unknown(name)) from None

    def semaphores(self, name: str) -> list[Semaphore]:
        """``[semaphore name]``, or, if no semaphore has that name, the live members
        of family ``name``; fails with a "did you mean" if neither."""
        try:
            return [self.open(name, suggest=False)]
        except UnknownSemaphore:
            members = self.family(name)
            if not members:
                raise click.ClickException(self.unknown(name)) from None
            return members

    def families(self) -> dict[str, list[str]]:
        """The names of the per-key families in Redis (the semaphores of one key
        function, see `celery_semaphore.per_key`; the ``family`` field each member's
        tasks record in its meta hash), with their members' names, sorted."""
        names = self.names()
        recorded = self.store.recorded_families(self.namespace, names)
        families: dict[str, list[str]] = {}
        for name, family in zip(names, recorded, strict=True):
            if family:
                families.setdefault(family, []).append(name)
        return families

    def family(self, name: str) -> list[Semaphore]:
        """The live members of family ``name`` (none if no family has that name)."""
        members = []
        for member in self.families().get(name, []):
            with suppress(UnknownSemaphore):  # its keys went since listing
                members.append(self.open(member, suggest=False))
        return members

    def one_at_a_time(self, name: str, members: Sequence[Semaphore]) -> str:
        """Why a command that changes a semaphore refuses family ``name``."""
        shown = ", ".join(m.name for m in members[:3]) + (", ..." if len(members) > 3 else "")
        command = click.get_current_context().info_name
        return (
            f"{name!r} is a family of {len(members)} semaphores made by a key function "
            f"({shown}); `{command}` changes one semaphore, and the family gains members as "
            f"new keys come: name a member (`{self.prog} status {name}` shows the busiest)"
        )

    def wake(self, name: str) -> str:
        """After a change of ``name`` that may admit tasks (a resume, a raised limit,
        a release): if it keeps tasks parked, every worker's heartbeat listening on
        the watch channel beats at once and hands over those now due. What happened,
        for the output ('' when none is parked: nobody is asked anything)."""
        parked = self.store.parked_counts(self.namespace, [name]).get(name, 0)
        if not parked:
            return ""
        heard = self.store.wake_workers(self.namespace, name)
        if not heard:
            tasks = "1 parked task waits" if parked == 1 else f"{parked} parked tasks wait"
            return f"no worker listens (none running?): its {tasks} for a worker's heartbeat"
        asked = "1 worker was" if heard == 1 else f"{heard} workers were"
        return f"{asked} asked to hand over its parked tasks now due ({parked} parked)"

    def open_new(self, name: str, limit: int | None, rate: RateLimit | None = None) -> Semaphore:
        """Semaphore ``name`` before its first use (no state in Redis)."""
        return Semaphore(
            self.store,
            name,
            limit,
            rate=rate,
            namespace=self.namespace,
            pause_after_loss=self.pause_after_loss,
        )

    def summary(self, sem: Semaphore) -> dict[str, Any]:
        """``sem``'s row of ``status``."""
        return rows.summary(sem.status(), self.recorded_rate(sem))

    def recorded_rate(self, sem: Semaphore) -> RateLimit | None:
        """The rate ``sem``'s tasks declare, as the last of them to ask recorded it
        (None: none, or not used yet); `SemaphoreStatus` shows only the effective one."""
        return self.store.recorded_rate(self.namespace, sem.name)

    def unknown(self, name: str) -> str:
        """One line on a name neither in Redis nor declared: the closest known names."""
        known = sorted(set(self.names()) | set(self.declared()) | set(self.families()))
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = (
            f"did you mean {' or '.join(repr(c) for c in close)}?"
            if close
            else f"`{self.prog} status` lists those in {self.kind}; check semaphore_namespace"
        )
        return (
            f"no semaphore named {name!r} in {self.kind} (namespace {self.namespace!r}; never "
            f"used, or expired while idle), nor declared by this app; {hint}"
        )


def _declared_by(task: Any) -> dict[str, InApp]:
    """The static semaphore names ``task`` declares limits on (a `LimitedTask`'s
    ``declared_limits``; a key function's names are known only once used)."""
    return {
        item.name: InApp(item.limit, item.rate)
        for item in getattr(task, "declared_limits", [])
        if isinstance(item.name, str)
    }


@contextmanager
def operator_for(ctx: click.Context) -> Iterator[Operator]:
    """The `Operator` of the app ``-A`` named, for one command; its connection
    closed after."""
    operator = Operator(ctx.obj.app, prog(ctx))
    try:
        yield operator
    finally:
        operator.store.close()
