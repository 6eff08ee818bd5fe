"""The click types of the commands' numbers and rates, and the bounds they accept.

A bad value fails with the wording of every bad argument (see
`celery_semaphore.cli.errors.usage_message`):
``LIMIT: '0' is not <accepts>; e.g. <a call that works>``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import click

from celery_semaphore.core.rates import parse_rate
from celery_semaphore.core.validation import MAX_LIMIT, MAX_SECONDS


class Number(click.ParamType):  # type: ignore[type-arg]  # generic only from click 8.5
    """A number from ``low`` to ``high``, read by ``parse`` (``int``: a whole number)."""

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
