"""The rows the commands print: a semaphore's or a family's ``status`` row, a task's
recorded info, the waiters of a line by fair key. ``--json`` prints them as they
are; `celery_semaphore.cli.render` lays them out as tables.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from celery_semaphore.core import Semaphore, SemaphoreStatus, WaiterInfo
from celery_semaphore.core.rates import RateLimit
from celery_semaphore.core.results import WAITER_STATES

BUSIEST = 5  # members of a family that ``status FAMILY`` shows

#: A waiter's state as the commands show it (`WaiterInfo.state`): a waiter that is
#: neither parked nor waiting in place holds its place in line while its message is
#: in the broker (sent, not at a worker yet) or held by a worker as a countdown
#: retry, or while it asks at a worker this instant; the store cannot tell these
#: apart, so it is shown as "in line" rather than "asking".
SHOWN_STATES = {WAITER_STATES[""]: "in line"}


def waiter_state(waiter: WaiterInfo) -> str:
    """``waiter``'s state as ``waiters`` shows it (see `SHOWN_STATES`)."""
    return SHOWN_STATES.get(waiter.state, waiter.state)


def where_waiting(status: SemaphoreStatus) -> dict[str, int]:
    """Where ``status``'s waiting tasks wait, from one reading: ``in_place`` (blocked
    at a worker, its turn near), counted among the waiters listed (the first 1,000 in
    line: a task waits in place only among the next ``limit``), and ``countdown``, the
    rest of those in line that are neither parked, handed over nor sent (in the
    broker): tasks that reached a worker and wait as countdown retries, their
    messages held by a worker until due (or that ask at a worker this instant)."""
    in_place = sum(1 for w in status.waiters if w.state == WAITER_STATES["w"])
    placed_sent = max(0, status.sent_count - status.sent_without_place_count)
    aside = status.parked_count + status.handed_over_count + in_place + placed_sent
    return {"in_place": in_place, "countdown": max(0, status.waiter_count - aside)}


def describe(info: str) -> dict[str, Any]:
    """A holder's or waiter's ``info`` (its task's JSON: task name, worker, ...) as fields."""
    try:
        parsed = json.loads(info) if info else {}
    except ValueError:
        return {"info": info}
    return parsed if isinstance(parsed, dict) else {"info": info}


def summary(status: SemaphoreStatus, declared_rate: RateLimit | None = None) -> dict[str, Any]:
    """``status`` as a row of ``status``; ``declared_rate``: the rate its tasks
    declare (see `celery_semaphore.core.redis.discovery.recorded_rate`)."""
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
        "kept": status.kept_count,
        "waiters": status.waiter_count,
        "parked": status.parked_count,
        "handed_over": status.handed_over_count,
        "sent": status.sent_count,
        "in_broker": status.sent_without_place_count,
        **where_waiting(status),
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


def is_one(found: Sequence[Semaphore], name: str) -> bool:
    """Whether `celery_semaphore.cli.operator.Operator.semaphores` found semaphore
    ``name`` (else family ``name``)."""
    return [s.name for s in found] == [name]


def family_summary(name: str, members: list[dict[str, Any]]) -> dict[str, Any]:
    """A family's `summary`, as the metrics sum it (limits, holders and waiters
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
        **{key: total(key) for key in ("holders", "kept", "waiters", "parked", "handed_over")},
        "sent": total("sent"),
        **{key: total(key) for key in ("in_broker", "in_place", "countdown")},
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


def flat(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``status`` rows for the table: a family's row, then its busiest members indented."""
    flattened = []
    for row in rows:
        if "busiest" not in row:
            flattened.append(row)
            continue
        rate = row["rate"] and f"{row['rate']} each"
        flattened.append(
            {**row, "name": f"{row['name']} (family of {row['members']})", "rate": rate}
        )
        flattened += [{**member, "name": "  " + member["name"]} for member in row["busiest"]]
    return flattened


def waiters_by_key(state: SemaphoreStatus) -> list[dict[str, Any]]:
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
