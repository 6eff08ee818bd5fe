"""Rates: how fast a semaphore grants permits ("20/s", "100/m", "1000/h").

A rate of ``count`` grants per ``per`` seconds allows one grant every
``per / count`` seconds (the interval), and ``burst`` grants at once after an
idle spell; measured on the Redis server's clock by GCRA in the scripts (see
"Rates" in ``lua/common_rates.lua``). ``burst=1`` spaces grants evenly, as Celery's own
per-worker ``rate_limit`` spaces starts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from . import validation

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_TEXT = re.compile(r"^\s*(\d+)\s*(?:/\s*([smh]))?\s*$")
EXAMPLES = "'20/s', '100/m' or '1000/h'"


@dataclass(frozen=True)
class RateLimit:
    """At most ``count`` grants per ``per`` seconds, ``burst`` at once after an idle spell."""

    count: int
    per: float = 1.0
    burst: int = 1

    def __post_init__(self) -> None:
        validation.check_limit(self.count, "rate count")
        validation.check_seconds(self.per, "rate per")
        validation.check_limit(self.burst, "rate burst")
        if self.interval_us < 1:
            raise ValueError(
                f"rate {self} is faster than one grant per microsecond: give a smaller count"
            )

    @property
    def interval_us(self) -> int:
        """Microseconds between two grants."""
        return math.floor(self.per * 1_000_000 / self.count)

    def encode(self) -> str:
        """The scripts' form: "<interval µs>|<burst>"."""
        return f"{self.interval_us}|{self.burst}"

    @classmethod
    def decode(cls, spec: str) -> RateLimit | None:
        """A rate from the scripts' form (None for ''), per second, minute or hour:
        the first that gives a whole count."""
        if not spec:
            return None
        interval, burst = (int(part) for part in spec.split("|"))
        for unit in (1.0, 60.0, 3600.0):
            count = unit * 1_000_000 / interval
            if count >= 1 and abs(count - round(count)) < 1e-5 * count:  # µs rounding
                return cls(round(count), unit, burst)
        return cls(1, interval / 1_000_000, burst)

    def __str__(self) -> str:
        unit = {1.0: "s", 60.0: "m", 3600.0: "h"}.get(float(self.per))
        text = f"{self.count}/{unit}" if unit else f"{self.count} per {self.per:g}s"
        return text if self.burst == 1 else f"{text} (burst {self.burst})"


def parse_rate(value: Any, argument: str = "rate", *, burst: int = 1) -> RateLimit:
    """A `RateLimit` from Celery's rate syntax ("20/s", "100/m", "1000/h"; a bare
    number is per second) or a `RateLimit`; errors name ``argument`` and the forms."""
    if isinstance(value, RateLimit):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str like {EXAMPLES}, got {value!r}")
    match = _TEXT.match(value)
    if not match:
        raise ValueError(
            f"{argument} must be a count per second, minute or hour like {EXAMPLES}, got {value!r}"
        )
    count, unit = int(match.group(1)), match.group(2) or "s"
    if count < 1:
        raise ValueError(f"{argument} must allow at least 1 start (like {EXAMPLES}), got {value!r}")
    try:
        return RateLimit(count, UNITS[unit], burst)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{argument}: {error}") from None
