"""The commands that change a semaphore for every worker, now: ``set-limit``,
``reset-limit``, ``set-rate``, ``reset-rate``, ``drain``, ``resume`` and ``release``.

A change that may admit tasks wakes the workers when the semaphore keeps tasks
parked (`celery_semaphore.cli.operator.Operator.wake`): they hand over those now
due. Each command says what it did, and only that.
"""

from __future__ import annotations

import dataclasses

import click

from celery_semaphore.core import SemaphoreStatus
from celery_semaphore.core.errors import UnknownSemaphore
from celery_semaphore.core.rates import RateLimit
from celery_semaphore.core.validation import MAX_LIMIT

from .errors import SemaphoreCommand
from .operator import operator_for
from .params import BURST, LIMIT, Rate


def _limit_text(limit: int, status: SemaphoreStatus) -> str:
    """``limit`` in words: "none" for the largest there is under a rate (a
    semaphore with only a rate)."""
    return "none" if status.rate is not None and limit >= MAX_LIMIT else str(limit)


def _then(*parts: str) -> str:
    """The parts of a command's line that say something, joined by "; "."""
    return "; ".join(part for part in parts if part)


def _declared_text(status: SemaphoreStatus, in_app: int | None) -> str:
    if status.declared_limit is not None:
        return f"declared {_limit_text(status.declared_limit, status)}"
    if in_app is not None:
        return f"not used yet, declared {in_app} in the app"
    return "not used yet"


@click.command("set-limit", cls=SemaphoreCommand, example="set-limit partner-api 10")
@click.argument("name")
@click.argument("limit", type=LIMIT)
@click.option(
    "--new",
    is_flag=True,
    help="NAME has no state in Redis and this app declares no such name (a per-key "
    "semaphore, say): cap it anyway, before its first use.",
)
@click.pass_context
def set_limit(ctx: click.Context, name: str, limit: int, new: bool) -> None:
    """Resize NAME to LIMIT for every worker, now (a runtime override).

    Works before NAME's first use too (preparing a launch): its first tasks obey
    LIMIT. A name this app declares needs nothing more; any other name, which
    might be a typo, needs --new. The override stays until reset-limit (once the
    semaphore is used, it expires with its other state after 7 days idle).
    """
    with operator_for(ctx) as operator:
        try:
            sem = operator.open(name, suggest=False)
        except UnknownSemaphore:
            members = operator.family(name)
            if members:
                raise click.ClickException(operator.one_at_a_time(name, members)) from None
            if not new:
                unknown = operator.unknown(name)
                raise click.ClickException(
                    f"{unknown}{'' if unknown.endswith('?') else '.'} To cap {name!r} before "
                    f"its first use anyway: `{operator.prog} set-limit {name} {limit} --new`"
                ) from None
            sem = operator.open_new(name, limit)
        before = sem.status()
        in_app = operator.in_app(name).limit if before.declared_limit is None else None
        previous = sem.set_limit(limit)
        declared = _declared_text(before, in_app)
        if previous is not None:
            was = f"was {previous} by override; {declared}"
        elif before.declared_limit is not None:
            was = f"was {_limit_text(before.declared_limit, before)}, {declared}"
        else:
            was = declared
        note = "" if before.declared_limit is not None else ": its first tasks obey it"
        woken = operator.wake(name) if limit > before.effective_limit else ""
        click.echo(_then(f"{name}: limit {limit} ({was}){note}", woken))


@click.command("reset-limit", cls=SemaphoreCommand, example="reset-limit partner-api")
@click.argument("name")
@click.pass_context
def reset_limit(ctx: click.Context, name: str) -> None:
    """Drop NAME's runtime override: back to the limit its tasks declare."""
    with operator_for(ctx) as operator:
        sem = operator.open(name)
        before = sem.status()
        previous = sem.clear_limit()
        declared = before.declared_limit
        if declared is None:
            in_app = operator.in_app(name).limit
            then = "" if in_app is None else f" ({in_app} in the app)"
            drain = ""
            if before.draining and name not in operator.declared():  # status could not show it
                sem.set_draining(False)
                drain = "; its drain ended too"
            dropped = "no override" if previous is None else f"override {previous} dropped"
            click.echo(
                f"{name}: {dropped}{drain}; not used yet, so its tasks will "
                f"use the limit they declare{then}"
            )
        elif previous is None:
            click.echo(f"{name}: no override; limit {_limit_text(declared, before)} as declared")
        else:
            woken = operator.wake(name) if declared > previous else ""
            back = f"back to the declared limit {_limit_text(declared, before)}"
            click.echo(_then(f"{name}: {back} (was {previous} by override)", woken))


def _faster(rate: RateLimit | None, than: RateLimit | None) -> bool:
    """Whether ``rate`` may start tasks sooner than ``than`` (None: no rate)."""
    if than is None:
        return False
    if rate is None:
        return True
    shorter, longer = rate.interval_us < than.interval_us, rate.interval_us > than.interval_us
    return shorter or (not longer and rate.burst > than.burst)


@click.command("set-rate", cls=SemaphoreCommand, example="set-rate partner-api 100/m")
@click.argument("name")
@click.argument("rate", type=Rate())
@click.option(
    "--burst",
    default="1",
    type=BURST,
    metavar="N",
    show_default=True,
    help="Starts allowed at once after an idle spell (1: evenly spaced).",
)
@click.pass_context
def set_rate(ctx: click.Context, name: str, rate: RateLimit, burst: int) -> None:
    """Limit how fast NAME starts tasks, for every worker, now (a runtime override
    of the rate its tasks declare): RATE starts per second, minute or hour, like
    20/s, 100/m or 1000/h.

    Works before NAME's first use too, for a name this app declares. Running
    tasks go on; a lower rate spaces the next starts. The override stays until
    reset-rate (once the semaphore is used, it expires with its other state
    after 7 days idle).
    """
    with operator_for(ctx) as operator:
        sem = operator.open(name)
        before = sem.status()
        recorded = operator.recorded_rate(sem)
        rate = dataclasses.replace(rate, burst=burst)
        previous = sem.set_rate(rate)
        used = before.declared_limit is not None
        if used:
            declared = f"declared {recorded}" if recorded else "none declared"
        else:
            in_app = operator.in_app(name).rate
            declared = "not used yet" + (f", declared {in_app} in the app" if in_app else "")
        if previous is not None:
            was = f"was {previous} by override; {declared}"
        elif recorded is not None:
            was = f"was {recorded}, {declared}"
        else:
            was = declared
        note = "" if used else ": its first tasks obey it"
        woken = operator.wake(name) if _faster(rate, before.rate) else ""
        click.echo(_then(f"{name}: rate {rate} ({was}){note}", woken))


@click.command("reset-rate", cls=SemaphoreCommand, example="reset-rate partner-api")
@click.argument("name")
@click.pass_context
def reset_rate(ctx: click.Context, name: str) -> None:
    """Drop NAME's runtime rate override: back to the rate its tasks declare (or none)."""
    with operator_for(ctx) as operator:
        sem = operator.open(name)
        before = sem.status()
        recorded = operator.recorded_rate(sem)
        previous = sem.clear_rate()
        if before.declared_limit is None:
            in_app = operator.in_app(name).rate
            dropped = (
                "no rate override" if previous is None else f"rate override {previous} dropped"
            )
            click.echo(
                f"{name}: {dropped}; not used yet, so its tasks will use the rate they "
                f"declare ({in_app or 'none'} in the app)"
            )
        elif previous is None:
            now = f"rate {recorded} as declared" if recorded else "no rate declared"
            click.echo(f"{name}: no rate override; {now}")
        else:
            back = (
                f"back to the declared rate {recorded}"
                if recorded
                else "no rate declared, so no rate now"
            )
            woken = operator.wake(name) if _faster(recorded, previous) else ""
            click.echo(_then(f"{name}: {back} (was {previous} by override)", woken))


@click.command(cls=SemaphoreCommand, example="drain partner-api")
@click.argument("name")
@click.pass_context
def drain(ctx: click.Context, name: str) -> None:
    """Admit nobody new to NAME; holders finish."""
    with operator_for(ctx) as operator:
        if operator.open(name).set_draining(True):
            click.echo(f"{name}: already draining (admits nobody until `resume`)")
        else:
            click.echo(f"{name}: draining (admits nobody until `resume`)")


@click.command(cls=SemaphoreCommand, example="resume partner-api")
@click.argument("name")
@click.pass_context
def resume(ctx: click.Context, name: str) -> None:
    """End a drain of NAME: waiters are admitted at once, in line order."""
    with operator_for(ctx) as operator:
        if not operator.open(name).set_draining(False):
            click.echo(f"{name}: not draining; nothing changed")
            return
        click.echo(_then(f"{name}: admitting again", operator.wake(name)))


@click.command(
    cls=SemaphoreCommand, example="release partner-api 9b0c6a1e-5f3d-4c2e-8a7b-1d2e3f4a5b6c"
)
@click.argument("name")
@click.argument("holder")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def release(ctx: click.Context, name: str, holder: str, yes: bool) -> None:
    """Force-release HOLDER's permit of NAME (a stuck permit; HOLDER: its task id)."""
    with operator_for(ctx) as operator:
        sem = operator.open(name)
        none_held = f"{holder!r} holds no permit of {name!r} (`{operator.prog} holders {name}`)"
        if not _may_hold(sem.status(), holder):
            raise click.ClickException(none_held)
        question = f"Release {holder}'s permit of {name}? Its task may still be running"
        try:
            confirmed = yes or click.confirm(question)
        except click.Abort:  # end of input, or Ctrl-C
            confirmed = False
        if not confirmed:
            raise click.ClickException("not released: not confirmed (--yes skips the question)")
        if not sem.release(holder):  # it let go meanwhile
            raise click.ClickException(none_held)
        click.echo(_then(f"{name}: released {holder}", operator.wake(name)))


def _may_hold(status: SemaphoreStatus, holder: str) -> bool:
    """Whether ``holder`` may hold a permit, as ``status`` reads: it is listed, or the
    list is cut short (it lists 1,000). Not used yet (only a limit set before its first
    use): nobody holds one, and a release would start the idle expiry of that limit."""
    if status.declared_limit is None:
        return False
    complete = sum(h.permits for h in status.holders) >= status.holder_count
    return not complete or any(h.holder == holder for h in status.holders)
