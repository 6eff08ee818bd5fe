"""Every failure in one line: the group's and commands' click classes, and the rewording.

Celery's ``celery`` group would show a usage error (a bad number, a missing
argument, an unknown option or command) as click does, in three lines with exit
status 2, and a semaphore's error as a traceback. `SemaphoreGroup` and
`SemaphoreCommand` catch both (`errors_in_one_line`) and reword them
(`usage_message`): one line ``Error: ...`` on stderr, exit status 1, naming the
argument and showing a call that works.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click

from celery_semaphore.core import SemaphoreError

from .params import Number, Rate


def one_line(message: str) -> str:
    return " ".join(message.split())


def prog(ctx: click.Context | None) -> str:
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
        with errors_in_one_line(ctx):  # some of the parser's errors name no context
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
    line and exit status 1 (see `errors_in_one_line`)."""

    command_class = SemaphoreCommand

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args and not ctx.resilient_parsing:
            click.echo(ctx.get_help())  # asking for nothing is asking for help
            ctx.exit()
        with errors_in_one_line(ctx):
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
                f"no command {name!r} in `{prog(ctx)}`; {hint}commands: {', '.join(commands)}"
            )
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        with errors_in_one_line(ctx):
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
def errors_in_one_line(ctx: click.Context) -> Iterator[None]:
    """A usage error, or a semaphore's error (or a bad value's), raised inside:
    one line ``Error: ...``, exit status 1."""
    try:
        yield
    except click.UsageError as error:
        raise click.ClickException(usage_message(error, error.ctx or ctx)) from None
    except (SemaphoreError, ValueError, TypeError) as error:
        raise click.ClickException(one_line(str(error))) from None


def usage_message(error: click.UsageError, ctx: click.Context) -> str:
    """``error`` (raised in ``ctx``) in one line: what was wrong, naming the
    argument, and how to call the command (an example; for an unknown option,
    where its help is)."""
    command = ctx.command
    if isinstance(error, click.NoSuchOption) and error.option_name in ("-A", "--app"):
        return f"{error.option_name} goes before `semaphore`: `celery -A proj semaphore ...`"
    if isinstance(error, click.NoSuchOption):
        hint = f" (did you mean {' or '.join(error.possibilities)}?)" if error.possibilities else ""
        called = prog(ctx) + ("" if isinstance(command, SemaphoreGroup) else f" {ctx.info_name}")
        return f"no such option {error.option_name}{hint}; see `{called} --help`"
    param = getattr(error, "param", None)
    if isinstance(error, click.MissingParameter) and param is not None:
        message = f"missing {param.param_type_name} {_param_name(param)}"
    elif isinstance(error, click.BadParameter) and param is not None:
        message = f"{_param_name(param)}: {error.message}"
    else:
        message = error.format_message().rstrip(".")
    example = getattr(command, "example", None)
    if example is None:
        return one_line(f"{message}; see `{prog(ctx)} --help`")
    return one_line(f"{message}; e.g. `{prog(ctx)} {example}`")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _param_name(param: click.Parameter) -> str:
    return "/".join(param.opts) if isinstance(param, click.Option) else param.human_readable_name
