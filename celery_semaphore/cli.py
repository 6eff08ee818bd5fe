"""``celery -A proj semaphore ...``: see and steer live semaphores.

Registered through the ``celery.commands`` entry point: Celery's ``celery``
group runs this group's commands, and would show a usage error (a bad number,
a missing argument, an unknown option or command) as click does, in three lines
with exit status 2. `SemaphoreGroup` turns those into one line too, so every
failure (those, an unknown semaphore, unreachable Redis, wrong settings) is one
line ``Error: ...`` on stderr and exit status 1; a bad value is worded one way
for every argument (`Number`, `_usage_message`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import click
import redis
from celery.bin.worker import worker as celery_worker_command

from .config import get_config
from .core import Semaphore, SemaphoreError, SemaphoreStatus
from .core.connection import connect, mask_url, translate
from .core.discovery import open_semaphore, semaphore_names
from .core.errors import UnknownSemaphore
from .core.keys import semaphore_keys, watch_channel
from .core.protocol import PAUSE_MARGIN, text
from .core.rates import RateLimit, parse_rate
from .core.validation import MAX_LIMIT, MAX_SECONDS
from .gates import QUEUE_PREFIX
from .worker.bootstep import add_worker_options


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
        self.url = mask_url(config.redis_url)
        self.client, _ = connect(config.redis_url)
        # A command that notices a loss of Redis's data pauses admissions as the
        # app's workers would (see celery_semaphore.core.epochs).
        self.pause_after_loss = config.renew_every + PAUSE_MARGIN
        self._declared: dict[str, InApp] | None = None

    def names(self) -> list[str]:
        return semaphore_names(self.client, self.namespace, self.url)

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
                self.client,
                self.namespace,
                name,
                self.url,
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
        try:
            with self.client.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.hget(semaphore_keys(self.namespace, name).meta, "family")
                recorded = pipe.execute()
        except redis.RedisError as error:
            raise translate(error, self.url) from error
        families: dict[str, list[str]] = {}
        for name, family in zip(names, recorded, strict=True):
            if family:
                families.setdefault(text(family), []).append(name)
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
        a release): every worker's heartbeat listening on the watch channel beats at
        once, and hands over the parked tasks now due. What happened, for the output."""
        try:
            heard = self.client.publish(watch_channel(self.namespace), name)
        except redis.RedisError as error:
            raise translate(error, self.url) from error
        if not heard:
            return (
                "no worker listens (none running?): its parked tasks wait for a worker's heartbeat"
            )
        workers = "1 worker hands" if heard == 1 else f"{heard} workers hand"
        return f"{workers} over its parked tasks now due"

    def open_new(self, name: str, limit: int | None, rate: RateLimit | None = None) -> Semaphore:
        """Semaphore ``name`` before its first use (no state in Redis)."""
        return Semaphore(
            self.client,
            name,
            limit,
            rate=rate,
            namespace=self.namespace,
            url=self.url,
            pause_after_loss=self.pause_after_loss,
        )

    def summary(self, sem: Semaphore) -> dict[str, Any]:
        """``sem``'s row of ``status``."""
        return _summary(sem.status(), self.recorded_rate(sem))

    def recorded_rate(self, sem: Semaphore) -> RateLimit | None:
        """The rate ``sem``'s tasks declare, as the last of them to ask recorded it
        (None: none, or not used yet); `SemaphoreStatus` shows only the effective one."""
        try:
            recorded = self.client.hget(sem.keys.meta, "rate")
        except redis.RedisError as error:
            raise translate(error, self.url) from error
        return RateLimit.decode(text(recorded or ""))

    def unknown(self, name: str) -> str:
        """One line on a name neither in Redis nor declared: the closest known names."""
        known = sorted(set(self.names()) | set(self.declared()) | set(self.families()))
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = (
            f"did you mean {' or '.join(repr(c) for c in close)}?"
            if close
            else f"`{self.prog} status` lists those in Redis; check semaphore_namespace"
        )
        return (
            f"no semaphore named {name!r} in Redis (namespace {self.namespace!r}; never "
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


def _one_line(message: str) -> str:
    return " ".join(message.split())


@contextmanager
def _operator(ctx: click.Context) -> Iterator[Operator]:
    operator = Operator(ctx.obj.app, _prog(ctx))
    try:
        yield operator
    finally:
        operator.client.close()


class Number(click.ParamType):  # type: ignore[type-arg]  # generic only from click 8.5
    """A number from ``low`` to ``high``, read by ``parse`` (``int``: a whole number).
    A bad value fails with the wording of every bad argument (`_usage_message`):
    ``LIMIT: '0' is not <accepts>; e.g. <a call that works>``."""

    name = "number"

    def __init__(self, parse: Callable[[str], float], low: float, high: float, accepts: str):
        self.parse, self.low, self.high, self.accepts = parse, low, high, accepts

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            number = self.parse(value.strip())
        except ValueError:
            number = math.nan
        if not self.low <= number <= self.high:  # nan is not
            self.fail(f"{value!r} is not {self.accepts}", param, ctx)
        return number


class Rate(click.ParamType):  # type: ignore[type-arg]  # generic only from click 8.5
    """A rate in Celery's syntax ("20/s", "100/m", "1000/h"), worded as `Number` when bad."""

    name = "rate"
    accepts = f"a count from 1 to {MAX_LIMIT} per second, minute or hour (20/s, 100/m, 1000/h)"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return parse_rate(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not {self.accepts}", param, ctx)


LIMIT = Number(int, 1, MAX_LIMIT, f"a whole number from 1 to {MAX_LIMIT}")
BURST = Number(int, 1, MAX_LIMIT, f"a whole number from 1 to {MAX_LIMIT}")
INTERVAL = Number(float, 0.1, MAX_SECONDS, f"a number of seconds from 0.1 to {MAX_SECONDS:.0f}")


def _prog(ctx: click.Context | None) -> str:
    """How the operator called this group: ``celery -A proj semaphore``."""
    app = ctx.find_root().params.get("app") if ctx is not None else None
    return f"celery -A {app} semaphore" if isinstance(app, str) else "celery semaphore"


class SemaphoreCommand(click.Command):
    """A command of the group, with an ``example`` shown in its help and in its
    usage errors."""

    def __init__(self, *args: Any, example: str, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", f"Example: celery -A proj semaphore {example}")
        super().__init__(*args, **kwargs)
        self.example = example

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        with _errors_in_one_line(ctx):  # some of the parser's errors name no context
            try:
                return super().parse_args(ctx, list(args))
            except click.NoSuchOption:
                self._check_negative(ctx, args)
                raise

    def _check_negative(self, ctx: click.Context, args: list[str]) -> None:
        """click takes a negative number for an option: given to a number argument,
        fail as any bad value of that argument does."""
        numbers = [
            p
            for p in self.params
            if isinstance(p, click.Argument) and isinstance(p.type, Number | Rate)
        ]
        negative = [arg for arg in args if arg.startswith("-") and _is_number(arg.split("/")[0])]
        if numbers and negative:
            numbers[0].type.convert(negative[0], numbers[0], ctx)


class SemaphoreGroup(click.Group):
    """The ``semaphore`` group: every error of its own or of its commands is one
    line and exit status 1 (see `_errors_in_one_line`)."""

    command_class = SemaphoreCommand

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args and not ctx.resilient_parsing:
            click.echo(ctx.get_help())  # asking for nothing is asking for help
            ctx.exit()
        with _errors_in_one_line(ctx):
            return super().parse_args(ctx, args)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0]
        if self.get_command(ctx, name) is None and not name.startswith("-"):
            commands = self.list_commands(ctx)
            close = _closest(name, commands)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            raise click.ClickException(
                f"no command {name!r} in `{_prog(ctx)}`; {hint}commands: {', '.join(commands)}"
            )
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        with _errors_in_one_line(ctx):
            return super().invoke(ctx)


def _closest(word: str, choices: Sequence[str]) -> list[str]:
    """The choice closest to ``word``, and the next if nearly as close (set-limt:
    set-limit or reset-limit; stauts: status, not set-rate)."""
    scored = sorted(
        ((difflib.SequenceMatcher(None, word, choice).ratio(), choice) for choice in choices),
        reverse=True,
    )
    best = scored[0][0] if scored else 0.0
    return [choice for ratio, choice in scored[:2] if ratio >= max(0.5, best - 0.15)]


@contextmanager
def _errors_in_one_line(ctx: click.Context) -> Iterator[None]:
    """Celery's ``celery`` group would show a usage error as click does (three
    lines, exit status 2), and a semaphore's error as a traceback: each becomes
    one line ``Error: ...``, exit status 1."""
    try:
        yield
    except click.UsageError as error:
        raise click.ClickException(_usage_message(error, error.ctx or ctx)) from None
    except (SemaphoreError, ValueError, TypeError) as error:
        raise click.ClickException(_one_line(str(error))) from None


def _usage_message(error: click.UsageError, ctx: click.Context) -> str:
    """``error`` (raised in ``ctx``) in one line: what was wrong, naming the
    argument, and how to call the command (an example; for an unknown option,
    where its help is)."""
    command = ctx.command
    if isinstance(error, click.NoSuchOption) and error.option_name in ("-A", "--app"):
        return f"{error.option_name} goes before `semaphore`: `celery -A proj semaphore ...`"
    if isinstance(error, click.NoSuchOption):
        hint = f" (did you mean {' or '.join(error.possibilities)}?)" if error.possibilities else ""
        prog = _prog(ctx) + ("" if isinstance(command, SemaphoreGroup) else f" {ctx.info_name}")
        return f"no such option {error.option_name}{hint}; see `{prog} --help`"
    param = getattr(error, "param", None)
    if isinstance(error, click.MissingParameter) and param is not None:
        message = f"missing {param.param_type_name} {_param_name(param)}"
    elif isinstance(error, click.BadParameter) and param is not None:
        message = f"{_param_name(param)}: {error.message}"
    else:
        message = error.format_message().rstrip(".")
    example = getattr(command, "example", None)
    if example is None:
        return _one_line(f"{message}; see `{_prog(ctx)} --help`")
    return _one_line(f"{message}; e.g. `{_prog(ctx)} {example}`")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _param_name(param: click.Parameter) -> str:
    return "/".join(param.opts) if isinstance(param, click.Option) else param.human_readable_name


def _describe(info: str) -> dict[str, Any]:
    try:
        parsed = json.loads(info) if info else {}
    except ValueError:
        return {"info": info}
    return parsed if isinstance(parsed, dict) else {"info": info}


def _summary(status: SemaphoreStatus, declared_rate: RateLimit | None = None) -> dict[str, Any]:
    """``status`` as a row of ``status``; ``declared_rate``: the rate its tasks
    declare (see `Operator.recorded_rate`)."""
    now = status.server_time
    rated = status.rate is not None
    paused = status.rate_paused_until if rated else None
    return {
        "name": status.name,
        "declared_limit": status.declared_limit,
        "override": status.override,
        "effective_limit": status.effective_limit,
        "draining": status.draining,
        "holders": status.holder_count,
        "waiters": status.waiter_count,
        "parked": status.parked_count,
        "handed_over": status.handed_over_count,
        "sent": status.sent_count,
        "in_broker": status.sent_without_place_count,
        "utilization": round(status.holder_count / max(status.effective_limit, 1), 3),
        "oldest_holder_age": round(now - min(h.acquired_at for h in status.holders), 3)
        if status.holders
        else None,
        "shortest_lease_left": round(min(h.expires_at for h in status.holders) - now, 3)
        if status.holders
        else None,
        "rate": _rate_text(status.rate),
        "declared_rate": _rate_text(declared_rate),
        "rate_override": _rate_text(status.rate_override),
        "rate_room": status.rate_room if rated else None,
        "next_start_in": round(max(0.0, status.next_start_at - now), 3)
        if rated and status.next_start_at is not None
        else None,
        "rate_paused_until": paused,
        "rate_paused_for": round(paused - now, 3) if paused is not None else None,
        "fair_keys_waiting": status.fair_keys_waiting,
        "fair_grants": status.fair_grants,
        "fair_keys": [dataclasses.asdict(key) for key in status.fair_keys],
        "shadow_limit_refusals": status.shadow_limit_refusals,
        "shadow_rate_refusals": status.shadow_rate_refusals,
        "shadow_delay": round(status.shadow_delay, 3),
        "shadow_peak": status.shadow_peak,
        "shadow": sorted(status.shadow),
    }


def _rate_text(rate: RateLimit | None) -> str | None:
    return None if rate is None else str(rate)


def _uncapped(row: dict[str, Any]) -> bool:
    """Whether ``row``'s semaphore has a rate and no concurrency limit (a semaphore
    with only a rate has the largest limit there is)."""
    return row["rate"] is not None and row["effective_limit"] >= MAX_LIMIT


def _limit_cell(row: dict[str, Any]) -> str:
    limit = "-" if _uncapped(row) else str(row["effective_limit"])
    if row["override"] is not None:
        declared = row["declared_limit"]
        limit += f"({'-' if declared is None else declared})"
    return limit + (" D" if row["draining"] else "")


def _rate_cell(row: dict[str, Any]) -> str:
    rate = row["rate"] or "-"
    if row.get("rate_override") is not None:
        rate += f"({row['declared_rate'] or '-'})"
    return rate


def _next_start_cell(row: dict[str, Any]) -> str:
    """When the rate lets the next task start: ``now``, ``in 0.4s``, or ``paused
    until 14:03:22`` (local time) after a task raised RateLimited."""
    if row["rate_paused_until"] is not None:
        return "paused until " + time.strftime("%H:%M:%S", time.localtime(row["rate_paused_until"]))
    if row["rate"] is None or row.get("next_start_in") is None:
        return "-"
    return "now" if row["rate_room"] else f"in {row['next_start_in']:.1f}s"


def _seconds_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


BUSIEST = 5  # members of a family that ``status FAMILY`` shows
FAIR_SHOWN = 5  # fair keys of a semaphore that the ``status`` table shows

#: A column of a table: header, alignment ("<" left, ">" right), cell of a row.
Column = tuple[str, str, Callable[[dict[str, Any]], str]]


def _table(columns: Sequence[Column], rows: Sequence[dict[str, Any]]) -> str:
    """``rows`` under the headers, each column as wide as its widest cell."""
    lines = [[header for header, _, _ in columns]]
    lines += [[cell(row) for _, _, cell in columns] for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    return "\n".join(
        "  ".join(
            f"{text:{align}{width}}"
            for text, (_, align, _), width in zip(line, columns, widths, strict=True)
        ).rstrip()
        for line in lines
    )


# The columns of each table; a new column is one more line here.
STATUS_COLUMNS: list[Column] = [
    ("SEMAPHORE", "<", lambda row: str(row["name"])),
    ("LIMIT", ">", _limit_cell),
    ("HOLD", ">", lambda row: str(row["holders"])),
    ("WAIT", ">", lambda row: str(row["waiters"] + row["in_broker"])),
    ("PARKED", ">", lambda row: str(row["parked"])),
    ("SENT", ">", lambda row: str(row["sent"])),
    ("UTIL", ">", lambda row: "-" if _uncapped(row) else f"{row['utilization']:.0%}"),
    ("OLDEST", ">", lambda row: _seconds_cell(row["oldest_holder_age"])),
    ("LEASE", ">", lambda row: _seconds_cell(row["shortest_lease_left"])),
    ("RATE", ">", _rate_cell),
    ("NEXT START", ">", _next_start_cell),
]
HOLDERS_COLUMNS: list[Column] = [
    ("HOLDER", "<", lambda row: str(row["holder"])),
    ("PERMITS", ">", lambda row: str(row["permits"])),
    ("TASK", "<", lambda row: str(row.get("task", "-"))),
    ("WORKER", "<", lambda row: str(row.get("worker", "-"))),
    ("HELD", ">", lambda row: _seconds_cell(row["held_for"])),
    ("LEASE", ">", lambda row: _seconds_cell(row["lease_left"])),
]
FAIR_KEYS_COLUMNS: list[Column] = [
    ("KEY", "<", lambda row: str(row["key"])),
    ("WAITING", ">", lambda row: str(row["waiting"])),
    ("GRANTS", ">", lambda row: str(row["grants"])),
    ("SHARE", ">", lambda row: f"{row['share']:.0%}"),
]
WAITERS_BY_KEY_COLUMNS: list[Column] = [
    ("KEY", "<", lambda row: "-" if row["fair_key"] is None else str(row["fair_key"])),
    ("WAITING", ">", lambda row: str(row["waiting"])),
    ("FIRST", ">", lambda row: str(row["first_position"])),
    ("LONGEST", ">", lambda row: _seconds_cell(row["longest_waiting"])),
]
WAITERS_COLUMNS: list[Column] = [
    ("#", ">", lambda row: str(row["position"] or "-")),
    ("HOLDER", "<", lambda row: str(row["holder"])),
    ("TASK", "<", lambda row: str(row.get("task", "-"))),
    ("WORKER", "<", lambda row: str(row.get("worker", "-"))),
    ("STATE", "<", lambda row: str(row["state"])),
    ("WAITING", ">", lambda row: _seconds_cell(row["waiting_for"])),
]
#: Shown before WAITING while a fair key waits (a line without one shows no KEY column).
WAITER_KEY_COLUMN: Column = (
    "KEY",
    "<",
    lambda row: "-" if row["fair_key"] is None else str(row["fair_key"]),
)


# Celery's command line imports this module (the ``celery.commands`` entry point)
# before it parses anything: the place to give ``celery worker`` its options.
add_worker_options(celery_worker_command)


@click.group(cls=SemaphoreGroup)
@click.pass_context
def semaphore(ctx: click.Context) -> None:
    """See and steer celery-semaphore's semaphores.

    NAME is a semaphore's name as its tasks declare it (semaphore=...), or
    queue:<queue> for a queue cap; status, holders and waiters also take a
    per-key family's name (per_key(family, ...)). Every error is one line on stderr and exit
    status 1.
    """


@semaphore.command(example="status partner-api --watch --interval 5")
@click.argument("names", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--watch", is_flag=True, help="Refresh in place until Ctrl-C.")
@click.option(
    "--interval",
    default="2",
    type=INTERVAL,
    metavar="SECONDS",
    show_default=True,
    help="Time between refreshes (0.1 to 604800).",
)
@click.pass_context
def status(
    ctx: click.Context, names: tuple[str, ...], as_json: bool, watch: bool, interval: float
) -> None:
    """Limits, holders, waiters and utilization of NAMES (default: all in Redis and
    all the app declares). A per-key family's name shows the family's sums and
    its busiest members.

    LIMIT shows an override over the declared limit as 3(5), over none yet (set
    before first use) as 3(-); D marks a draining semaphore. WAIT counts every
    task waiting for it, wherever it waits: its places in line (asking, waiting
    in place, parked, handed over) and the tasks still in the broker whose place
    lapsed. PARKED: of those, parked in Redis until their turn. SENT: published
    with a place and not at a worker yet (in the broker).

    Below the table, each semaphore whose line is shared by fair keys (fair_key=)
    shows how many keys wait and the 5 with the most waiting: their waiters in
    line, their grants in this minute and the one before (Redis's clock: 60 to
    120 s), and their SHARE of all fair grants then (--json lists up to 20).
    Last, each semaphore with shadow limits (shadow=True), or whose shadow limits
    counted anything: which limits are shadow limits now (as the last task to ask
    declared them), the grants its limit would have refused and the most permits
    held at once over it (the peak it would have had to allow), the grants its rate
    would have delayed and by how long in all.
    """
    with _operator(ctx) as operator:
        while True:
            rows = _status_rows(operator, names)
            text = json.dumps(rows, indent=2) if as_json else _status_text(_flat(rows))
            if not watch:
                click.echo(text)
                return
            click.echo("\x1b[H\x1b[2J" + time.strftime("%H:%M:%S ") + operator.url + "\n" + text)
            try:
                time.sleep(interval)
            except KeyboardInterrupt:
                return


def _status_text(rows: list[dict[str, Any]]) -> str:
    """The ``status`` table; below it, each fair line's keys with the most waiting."""
    blocks = [_table(STATUS_COLUMNS, rows)]
    for row in rows:
        if row["fair_keys"]:
            blocks.append(_fair_keys_text(row))
    shadows = [_shadow_text(row) for row in rows if _shadowed(row)]
    if shadows:
        blocks.append("\n".join(shadows))
    return "\n\n".join(blocks)


def _shadowed(row: dict[str, Any]) -> bool:
    return bool(row["shadow"] or row["shadow_limit_refusals"] or row["shadow_rate_refusals"])


def _shadow_text(row: dict[str, Any]) -> str:
    """Which of ``row``'s limits are shadow limits now, and what they would have done,
    had they been enforced."""
    declared = ", ".join(row["shadow"]) if row["shadow"] else "none now"
    said = []
    if row["shadow_limit_refusals"]:
        said.append(
            f"the limit would have refused {_grants(row['shadow_limit_refusals'])} "
            f"(peak {row['shadow_peak']} held at once)"
        )
    if row["shadow_rate_refusals"]:
        said.append(
            f"the rate would have delayed {_grants(row['shadow_rate_refusals'])} "
            f"by {row['shadow_delay']:.1f}s in all"
        )
    return f"{row['name'].strip()}: shadow ({declared}): " + (
        "; ".join(said) or "nothing counted yet"
    )


def _grants(count: int) -> str:
    return f"{count} grant{'' if count == 1 else 's'}"


def _fair_keys_text(row: dict[str, Any]) -> str:
    """``row``'s fair keys waiting: the `FAIR_SHOWN` with the most waiting, with their
    share of the fair grants of this minute and the minute before (server clock)."""
    keys = row["fair_keys"]
    count = row["fair_keys_waiting"]
    head = (
        f"{row['name'].strip()}: {count} fair key{'' if count == 1 else 's'} waiting; "
        f"{row['fair_grants']} fair grant{'' if row['fair_grants'] == 1 else 's'} "
        "this minute and the one before"
    )
    shown = keys[:FAIR_SHOWN]
    more = count - len(shown)
    table = _table(FAIR_KEYS_COLUMNS, shown)
    lines = [head, *("  " + line for line in table.splitlines())]
    if more > 0:
        lines.append(f"  ... and {more} more key{'' if more == 1 else 's'} (--json lists up to 20)")
    return "\n".join(lines)


def _status_rows(operator: Operator, names: Sequence[str]) -> list[dict[str, Any]]:
    """``status`` of NAMES (default: all), a family as its `_family_summary`."""
    if not names:
        return [operator.summary(s) for s in operator.open_all()]
    rows = []
    for name in names:
        found = operator.semaphores(name)
        summaries = [operator.summary(s) for s in found]
        rows += summaries if _is_one(found, name) else [_family_summary(name, summaries)]
    return rows


def _is_one(found: Sequence[Semaphore], name: str) -> bool:
    """Whether `Operator.semaphores` found semaphore ``name`` (else family ``name``)."""
    return [s.name for s in found] == [name]


def _family_summary(name: str, members: list[dict[str, Any]]) -> dict[str, Any]:
    """A family's `_summary`, as the metrics sum it (limits, holders and waiters
    summed, draining if any member drains), with its members and the busiest."""

    def total(key: str) -> int:
        return sum(int(row[key]) for row in members)

    ages = [row["oldest_holder_age"] for row in members if row["oldest_holder_age"] is not None]
    leases = [
        row["shortest_lease_left"] for row in members if row["shortest_lease_left"] is not None
    ]
    limit = total("effective_limit")
    rates = {row["rate"] for row in members}
    paused = [row["rate_paused_until"] for row in members if row["rate_paused_until"] is not None]
    busiest = sorted(
        members,
        key=lambda row: (-(row["holders"] + row["waiters"] + row["in_broker"]), row["name"]),
    )
    return {
        "name": name,
        "members": len(members),
        "declared_limit": None,
        "override": None,
        "effective_limit": limit,
        "draining": any(row["draining"] for row in members),
        **{key: total(key) for key in ("holders", "waiters", "parked", "handed_over", "sent")},
        "in_broker": total("in_broker"),
        "utilization": round(total("holders") / max(limit, 1), 3),
        "oldest_holder_age": max(ages, default=None),
        "shortest_lease_left": min(leases, default=None),
        # each member's own rate (a rate per key), when they agree
        "rate": rates.pop() if len(rates) == 1 else None,
        "declared_rate": None,
        "rate_override": None,
        "rate_room": None,
        "next_start_in": None,
        "rate_paused_until": max(paused, default=None),
        "rate_paused_for": max(
            (row["rate_paused_for"] for row in members if row["rate_paused_for"] is not None),
            default=None,
        ),
        # each member's fair keys are its own line's: its row lists them
        "fair_keys_waiting": total("fair_keys_waiting"),
        "fair_grants": total("fair_grants"),
        "fair_keys": [],
        **{key: total(key) for key in ("shadow_limit_refusals", "shadow_rate_refusals")},
        "shadow_delay": round(sum(row["shadow_delay"] for row in members), 3),
        # the permits of one member at once: members' peaks need not coincide
        "shadow_peak": max((row["shadow_peak"] for row in members), default=0),
        # the shadow limits any member's tasks declare
        "shadow": sorted({kind for row in members for kind in row["shadow"]}),
        "busiest": busiest[:BUSIEST],
    }


def _flat(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``status`` rows for the table: a family's row, then its busiest members indented."""
    flat = []
    for row in rows:
        if "busiest" not in row:
            flat.append(row)
            continue
        rate = row["rate"] and f"{row['rate']} each"
        flat.append({**row, "name": f"{row['name']} (family of {row['members']})", "rate": rate})
        flat += [{**member, "name": "  " + member["name"]} for member in row["busiest"]]
    return flat


def _with_semaphore(columns: list[Column], found: Sequence[Semaphore], name: str) -> list[Column]:
    """``columns``, with the semaphore of each row first for a family."""
    if _is_one(found, name):
        return columns
    return [("SEMAPHORE", "<", lambda row: str(row["semaphore"])), *columns]


@semaphore.command(example="holders partner-api --json")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def holders(ctx: click.Context, name: str, as_json: bool) -> None:
    """Who holds a permit of NAME: task id, permits held (its weight), task name,
    worker, held since."""
    with _operator(ctx) as operator:
        found = operator.semaphores(name)
        states = [s.status() for s in found]
        rows = [
            {
                "semaphore": state.name,
                "holder": h.holder,
                "permits": h.permits,
                **_describe(h.info),
                "held_for": round(state.server_time - h.acquired_at, 3),
                "lease_left": round(h.expires_at - state.server_time, 3),
                "fencing_token": h.fencing_token,
            }
            for state in states
            for h in state.holders
        ]
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        click.echo(_table(_with_semaphore(HOLDERS_COLUMNS, found, name), rows))
        _echo_rates(states)


@semaphore.command(example="waiters partner-api --json")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--by-key",
    is_flag=True,
    help="One row per fair key (fair_key=): its waiters in line, the position of its "
    "first, the longest wait.",
)
@click.pass_context
def waiters(ctx: click.Context, name: str, as_json: bool, by_key: bool) -> None:
    """Who waits for NAME, in line order: task id, task name, worker, state, fair key,
    waiting since.

    State: parked (its message waits in Redis for its turn), handed over (published
    for its turn, not yet at a worker), waiting in place (blocked at a worker, its
    turn near), asking (at a worker, or retrying itself), in broker (published with
    a place that lapsed before it reached a worker; listed last, no position).
    KEY: the fair key whose turns it takes (-: none).

    --by-key groups the waiters in line by fair key, in the order of each key's
    first waiter (those without a key as -; tasks in the broker have no place, so
    no key, and are left out); of a line of more than 1,000, the first 1,000."""
    with _operator(ctx) as operator:
        found = operator.semaphores(name)
        states = [s.status() for s in found]
        if by_key:
            rows = [row for state in states for row in _by_key(state)]
            if as_json:
                click.echo(json.dumps(rows, indent=2))
                return
            click.echo(_table(_with_semaphore(WAITERS_BY_KEY_COLUMNS, found, name), rows))
            for state in states:
                if state.waiter_count > len(state.waiters):
                    click.echo(
                        f"{state.name}: the first {len(state.waiters)} of "
                        f"{state.waiter_count} waiters in line"
                    )
            return
        rows = [
            {
                "semaphore": state.name,
                "position": w.position,
                "holder": w.holder,
                **_describe(w.info),
                "ticket": w.ticket,
                "state": w.state,
                "fair_key": w.fair_key,
                "waiting_for": round(state.server_time - w.since, 3),
            }
            for state in states
            for w in [*state.waiters, *state.sent_without_place]
        ]
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        columns = WAITERS_COLUMNS
        if any(state.fair_keys_waiting for state in states):
            columns = [*columns[:-1], WAITER_KEY_COLUMN, columns[-1]]
        click.echo(_table(_with_semaphore(columns, found, name), rows))
        _echo_rates(states)


def _by_key(state: SemaphoreStatus) -> list[dict[str, Any]]:
    """``waiters --by-key`` of one semaphore: its listed waiters in line by fair key."""
    rows: dict[str | None, dict[str, Any]] = {}
    for w in state.waiters:
        waiting_for = round(state.server_time - w.since, 3)
        row = rows.setdefault(
            w.fair_key,
            {
                "semaphore": state.name,
                "fair_key": w.fair_key,
                "waiting": 0,
                "first_position": w.position,
                "longest_waiting": waiting_for,
            },
        )
        row["waiting"] += 1
        row["longest_waiting"] = max(row["longest_waiting"], waiting_for)
    return list(rows.values())


def _echo_rates(states: list[SemaphoreStatus]) -> None:
    """Below a table of holders or waiters: each semaphore's rate and next start."""
    for state in states:
        if state.rate is not None:
            row = _summary(state)
            click.echo(f"{state.name}: rate {_rate_cell(row)}, next start {_next_start_cell(row)}")


def _limit_text(limit: int, status: SemaphoreStatus) -> str:
    """``limit`` in words: "none" for the largest there is under a rate (a
    semaphore with only a rate)."""
    return "none" if status.rate is not None and limit >= MAX_LIMIT else str(limit)


def _declared_text(status: SemaphoreStatus, in_app: int | None) -> str:
    if status.declared_limit is not None:
        return f"declared {_limit_text(status.declared_limit, status)}"
    if in_app is not None:
        return f"not used yet, declared {in_app} in the app"
    return "not used yet"


@semaphore.command("set-limit", example="set-limit partner-api 10")
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
    with _operator(ctx) as operator:
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
        if limit > before.effective_limit:
            note += f"; {operator.wake(name)}"
        click.echo(f"{name}: limit {limit} ({was}){note}")


@semaphore.command("reset-limit", example="reset-limit partner-api")
@click.argument("name")
@click.pass_context
def reset_limit(ctx: click.Context, name: str) -> None:
    """Drop NAME's runtime override: back to the limit its tasks declare."""
    with _operator(ctx) as operator:
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
            woken = f"; {operator.wake(name)}" if declared > previous else ""
            click.echo(
                f"{name}: back to the declared limit {_limit_text(declared, before)} "
                f"(was {previous} by override){woken}"
            )


def _faster(rate: RateLimit | None, than: RateLimit | None) -> bool:
    """Whether ``rate`` may start tasks sooner than ``than`` (None: no rate)."""
    if than is None:
        return False
    if rate is None:
        return True
    shorter, longer = rate.interval_us < than.interval_us, rate.interval_us > than.interval_us
    return shorter or (not longer and rate.burst > than.burst)


@semaphore.command("set-rate", example="set-rate partner-api 100/m")
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
    with _operator(ctx) as operator:
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
        if _faster(rate, before.rate):
            note += f"; {operator.wake(name)}"
        click.echo(f"{name}: rate {rate} ({was}){note}")


@semaphore.command("reset-rate", example="reset-rate partner-api")
@click.argument("name")
@click.pass_context
def reset_rate(ctx: click.Context, name: str) -> None:
    """Drop NAME's runtime rate override: back to the rate its tasks declare (or none)."""
    with _operator(ctx) as operator:
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
            woken = f"; {operator.wake(name)}" if _faster(recorded, previous) else ""
            click.echo(f"{name}: {back} (was {previous} by override){woken}")


@semaphore.command(example="drain partner-api")
@click.argument("name")
@click.pass_context
def drain(ctx: click.Context, name: str) -> None:
    """Admit nobody new to NAME; holders finish."""
    with _operator(ctx) as operator:
        operator.open(name).set_draining(True)
        click.echo(f"{name}: draining (admits nobody until `resume`)")


@semaphore.command(example="resume partner-api")
@click.argument("name")
@click.pass_context
def resume(ctx: click.Context, name: str) -> None:
    """End a drain of NAME: waiters are admitted at once, in line order."""
    with _operator(ctx) as operator:
        operator.open(name).set_draining(False)
        click.echo(f"{name}: admitting again; {operator.wake(name)}")


@semaphore.command(example="release partner-api 9b0c6a1e-5f3d-4c2e-8a7b-1d2e3f4a5b6c")
@click.argument("name")
@click.argument("holder")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def release(ctx: click.Context, name: str, holder: str, yes: bool) -> None:
    """Force-release HOLDER's permit of NAME (a stuck permit; HOLDER: its task id)."""
    with _operator(ctx) as operator:
        sem = operator.open(name)
        question = f"Release {holder}'s permit of {name}? Its task may still be running"
        try:
            confirmed = yes or click.confirm(question)
        except click.Abort:  # end of input, or Ctrl-C
            confirmed = False
        if not confirmed:
            raise click.ClickException("not released: not confirmed (--yes skips the question)")
        # Not used yet (only a limit set before first use): nobody holds a permit,
        # and a release would start the idle expiry of that limit.
        if sem.status().declared_limit is None or not sem.release(holder):
            raise click.ClickException(f"{holder!r} holds no permit of {name!r}")
        click.echo(f"{name}: released {holder}; {operator.wake(name)}")
