"""``celery -A proj semaphore ...``: see and steer live semaphores.

Registered through the ``celery.commands`` entry point. Every failure (unknown
name, bad number, unreachable Redis) is one line on stderr and exit status 1.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import wraps
from typing import Any

import click
from celery.bin.worker import worker as celery_worker_command

from .config import get_config
from .core import Semaphore, SemaphoreError, SemaphoreStatus
from .core.connection import connect, mask_url
from .core.discovery import open_semaphore, semaphore_names
from .core.errors import UnknownSemaphore
from .worker.bootstep import add_worker_options


class Operator:
    """The app's semaphores as the CLI sees them."""

    def __init__(self, app: Any) -> None:
        config = get_config(app)
        self.namespace = config.namespace
        self.url = mask_url(config.redis_url)
        self.client, _ = connect(config.redis_url)

    def names(self) -> list[str]:
        return semaphore_names(self.client, self.namespace, self.url)

    def open_all(self, names: Sequence[str] = ()) -> list[Semaphore]:
        """The semaphores ``names``, or every one in Redis (less those whose keys
        went, or whose limit no contender has declared yet, between listing and
        opening); a name asked for and unknown raises UnknownSemaphore."""
        if names:
            return [self.open(name) for name in names]
        opened = []
        for name in self.names():
            try:
                opened.append(self.open(name))
            except UnknownSemaphore:
                continue
        return opened

    def open(self, name: str) -> Semaphore:
        """Semaphore ``name``. It publishes nothing: the parked tasks its changes make
        due (``resume``, a raised limit) are handed over by the next heartbeat of a
        worker, which publishes to the broker the workers really use (this command's
        app may not be configured with it)."""
        return open_semaphore(self.client, self.namespace, name, self.url)


def _fail_cleanly(command: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (SemaphoreError, ValueError, TypeError) as error:
            raise click.ClickException(str(error)) from None

    return run


@contextmanager
def _operator(ctx: click.Context) -> Iterator[Operator]:
    operator = Operator(ctx.obj.app)
    try:
        yield operator
    finally:
        operator.client.close()


def _describe(info: str) -> dict[str, Any]:
    try:
        parsed = json.loads(info) if info else {}
    except ValueError:
        return {"info": info}
    return parsed if isinstance(parsed, dict) else {"info": info}


def _summary(status: SemaphoreStatus) -> dict[str, Any]:
    now = status.server_time
    return {
        "name": status.name,
        "declared_limit": status.declared_limit,
        "override": status.override,
        "effective_limit": status.effective_limit,
        "draining": status.draining,
        "holders": status.holder_count,
        "waiters": status.waiter_count,
        "utilization": round(status.holder_count / max(status.effective_limit, 1), 3),
        "oldest_holder_age": round(now - min(h.acquired_at for h in status.holders), 3)
        if status.holders
        else None,
        "shortest_lease_left": round(min(h.expires_at for h in status.holders) - now, 3)
        if status.holders
        else None,
    }


def _status_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'SEMAPHORE':<28} {'LIMIT':>9} {'HOLD':>5} {'WAIT':>5} {'UTIL':>5} "
        f"{'OLDEST':>8} {'LEASE':>7}"
    ]
    for row in rows:
        limit = str(row["effective_limit"])
        if row["override"] is not None:
            limit += f"({row['declared_limit']})"
        if row["draining"]:
            limit += " D"
        oldest = "-" if row["oldest_holder_age"] is None else f"{row['oldest_holder_age']:.1f}s"
        lease = "-" if row["shortest_lease_left"] is None else f"{row['shortest_lease_left']:.1f}s"
        lines.append(
            f"{row['name']:<28} {limit:>9} {row['holders']:>5} {row['waiters']:>5} "
            f"{row['utilization']:>5.0%} {oldest:>8} {lease:>7}"
        )
    return "\n".join(lines)


# Celery's command line imports this module (the ``celery.commands`` entry point)
# before it parses anything: the place to give ``celery worker`` its options.
add_worker_options(celery_worker_command)


@click.group()
@click.pass_context
def semaphore(ctx: click.Context) -> None:
    """See and steer celery-semaphore's semaphores."""


@semaphore.command()
@click.argument("names", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--watch", is_flag=True, help="Refresh in place until Ctrl-C.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True)
@click.pass_context
@_fail_cleanly
def status(
    ctx: click.Context, names: tuple[str, ...], as_json: bool, watch: bool, interval: float
) -> None:
    """Limits, holders, waiters and utilization of NAMES (default: all)."""
    with _operator(ctx) as operator:
        while True:
            rows = [_summary(s.status()) for s in operator.open_all(names)]
            text = json.dumps(rows, indent=2) if as_json else _status_table(rows)
            if not watch:
                click.echo(text)
                return
            click.echo("\x1b[H\x1b[2J" + time.strftime("%H:%M:%S ") + operator.url + "\n" + text)
            try:
                time.sleep(interval)
            except KeyboardInterrupt:
                return


@semaphore.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@_fail_cleanly
def holders(ctx: click.Context, name: str, as_json: bool) -> None:
    """Who holds a permit of NAME: task id, task name, worker, held since."""
    with _operator(ctx) as operator:
        state = operator.open(name).status()
        rows = [
            {
                "holder": h.holder,
                **_describe(h.info),
                "held_for": round(state.server_time - h.acquired_at, 3),
                "lease_left": round(h.expires_at - state.server_time, 3),
                "fencing_token": h.fencing_token,
            }
            for h in state.holders
        ]
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        click.echo(f"{'HOLDER':<38} {'TASK':<32} {'WORKER':<24} {'HELD':>8} {'LEASE':>7}")
        for row in rows:
            click.echo(
                f"{row['holder']:<38} {row.get('task', '-'):<32} {row.get('worker', '-'):<24} "
                f"{row['held_for']:>7.1f}s {row['lease_left']:>6.1f}s"
            )


@semaphore.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
@_fail_cleanly
def waiters(ctx: click.Context, name: str, as_json: bool) -> None:
    """Who waits for NAME, in line order: task id, task name, worker, state, waiting since.

    State: parked (its message waits in Redis for its turn), handed over (published
    for its turn, not yet at a worker), waiting in place (blocked at a worker, its
    turn near), asking (at a worker, or retrying itself)."""
    with _operator(ctx) as operator:
        state = operator.open(name).status()
        rows = [
            {
                "position": w.position,
                "holder": w.holder,
                **_describe(w.info),
                "ticket": w.ticket,
                "state": w.state,
                "waiting_for": round(state.server_time - w.since, 3),
            }
            for w in state.waiters
        ]
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        click.echo(
            f"{'#':>4} {'HOLDER':<38} {'TASK':<32} {'WORKER':<24} {'STATE':<12} {'WAITING':>8}"
        )
        for row in rows:
            click.echo(
                f"{row['position']:>4} {row['holder']:<38} {row.get('task', '-'):<32} "
                f"{row.get('worker', '-'):<24} {row['state']:<12} {row['waiting_for']:>7.1f}s"
            )


@semaphore.command("set-limit")
@click.argument("name")
@click.argument("limit", type=click.IntRange(min=1))
@click.pass_context
@_fail_cleanly
def set_limit(ctx: click.Context, name: str, limit: int) -> None:
    """Resize NAME to LIMIT for every worker, now (a runtime override)."""
    with _operator(ctx) as operator:
        previous = operator.open(name).set_limit(limit)
        click.echo(f"{name}: limit {limit} (was {'declared' if previous is None else previous})")


@semaphore.command("reset-limit")
@click.argument("name")
@click.pass_context
@_fail_cleanly
def reset_limit(ctx: click.Context, name: str) -> None:
    """Drop NAME's runtime override: back to the limit its tasks declare."""
    with _operator(ctx) as operator:
        operator.open(name).clear_limit()
        click.echo(f"{name}: back to the declared limit")


@semaphore.command()
@click.argument("name")
@click.pass_context
@_fail_cleanly
def drain(ctx: click.Context, name: str) -> None:
    """Admit nobody new to NAME; holders finish."""
    with _operator(ctx) as operator:
        operator.open(name).set_draining(True)
        click.echo(f"{name}: draining (admits nobody until `resume`)")


@semaphore.command()
@click.argument("name")
@click.pass_context
@_fail_cleanly
def resume(ctx: click.Context, name: str) -> None:
    """End a drain of NAME: waiters are admitted again."""
    with _operator(ctx) as operator:
        operator.open(name).set_draining(False)
        click.echo(f"{name}: admitting again")


@semaphore.command()
@click.argument("name")
@click.argument("holder")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
@_fail_cleanly
def release(ctx: click.Context, name: str, holder: str, yes: bool) -> None:
    """Force-release HOLDER's permit of NAME (a stuck permit)."""
    with _operator(ctx) as operator:
        sem = operator.open(name)
        if not yes:
            click.confirm(
                f"Release {holder}'s permit of {name}? Its task may still be running", abort=True
            )
        if not sem.release(holder):
            raise click.ClickException(f"{holder!r} holds no permit of {name!r}")
        click.echo(f"{name}: released {holder}")
