"""The commands' tables and lines of text, from their rows (`celery_semaphore.cli.rows`).

A table is a list of `Column`s; a new column is one more line in its list here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import click

from celery_semaphore.core import Semaphore, SemaphoreStatus
from celery_semaphore.core.validation import MAX_LIMIT

from .rows import is_one, summary

FAIR_SHOWN = 5  # fair keys of a semaphore that the ``status`` table shows

#: A column of a table: header, alignment ("<" left, ">" right), cell of a row.
Column = tuple[str, str, Callable[[dict[str, Any]], str]]


def table(columns: Sequence[Column], rows: Sequence[dict[str, Any]]) -> str:
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


def _holders_cell(row: dict[str, Any]) -> str:
    """The holders, and of them those kept by pool processes between tasks (idle, or
    running a task of that process: `celery_semaphore.kept_permits`)."""
    kept = row.get("kept") or 0
    return f"{row['holders']} ({kept} kept)" if kept else str(row["holders"])


def _seconds_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


STATUS_COLUMNS: list[Column] = [
    ("SEMAPHORE", "<", lambda row: str(row["name"])),
    ("LIMIT", ">", _limit_cell),
    ("HOLD", ">", _holders_cell),
    ("WAIT", ">", lambda row: str(row["waiters"] + row["in_broker"])),
    ("PARKED", ">", lambda row: str(row["parked"] + row["handed_over"])),
    ("IN PLACE", ">", lambda row: str(row["in_place"])),
    ("SENT", ">", lambda row: str(row["sent"])),
    ("COUNTDOWN", ">", lambda row: str(row["countdown"])),
    ("UTIL", ">", lambda row: "-" if _uncapped(row) else f"{row['utilization']:.0%}"),
    ("OLDEST", ">", lambda row: _seconds_cell(row["oldest_holder_age"])),
    ("LEASE", ">", lambda row: _seconds_cell(row["shortest_lease_left"])),
    ("RATE", ">", _rate_cell),
    ("NEXT START", ">", _next_start_cell),
]
HOLDERS_COLUMNS: list[Column] = [
    ("HOLDER", "<", lambda row: str(row["holder"])),
    ("PERMITS", ">", lambda row: str(row["permits"])),
    ("TASK", "<", lambda row: str(row.get("task", "kept" if "kept_by" in row else "-"))),
    ("WORKER", "<", lambda row: str(row.get("worker", row.get("kept_by", "-")))),
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
    ("TASK ID", "<", lambda row: str(row["holder"])),
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


def with_semaphore(columns: list[Column], found: Sequence[Semaphore], name: str) -> list[Column]:
    """``columns``, with the semaphore of each row first for a family."""
    if is_one(found, name):
        return columns
    return [("SEMAPHORE", "<", lambda row: str(row["semaphore"])), *columns]


def status_text(rows: list[dict[str, Any]]) -> str:
    """The ``status`` table; below it, each fair line's keys with the most waiting."""
    blocks = [table(STATUS_COLUMNS, rows)]
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
    lines = [head, *("  " + line for line in table(FAIR_KEYS_COLUMNS, shown).splitlines())]
    if more > 0:
        lines.append(f"  ... and {more} more key{'' if more == 1 else 's'} (--json lists up to 20)")
    return "\n".join(lines)


def echo_rates(states: list[SemaphoreStatus]) -> None:
    """Below a table of holders or waiters: each semaphore's rate and next start."""
    for state in states:
        if state.rate is not None:
            row = summary(state)
            click.echo(f"{state.name}: rate {_rate_cell(row)}, next start {_next_start_cell(row)}")
