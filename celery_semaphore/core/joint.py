"""Several semaphores taken in one step (acquire_all.lua): its arguments, its
reply, and when semaphores can be taken together (one client, one namespace, one
Redis Cluster slot).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.crc import key_slot

from . import validation
from .ask import Ask
from .errors import StaleHandover
from .protocol import SemaphoreSpec
from .replies import Granted, Refused, grant_of, place_of, read, text
from .results import Grant, Handover, Places


def joint_acquire_args(
    specs: Sequence[SemaphoreSpec],
    holder: str,
    ticket: int | None,
    *,
    queue: bool,
    wait_lease: float | None,
    hold_back: float,
    lease_timeout: float | None,
    info: str,
    weights: Sequence[tuple[int, int | None]],
    priority: int = 0,
    fair_keys: Sequence[str | None] | None = None,
    fair_weight: int | None = None,
    handover: tuple[int, int] | None = None,
) -> list[Any]:
    """acquire_all.lua's arguments; ``weights``: (permits, grants or None) per semaphore;
    ``fair_keys``: per semaphore, at most one not None; ``handover``: (index of the
    semaphore that handed it over, the `Handover`'s token)."""
    validation.check_holder(holder)
    validation.check_ticket(ticket)
    validation.check_info(info)
    hold_ms = int(1000 * validation.check_seconds(hold_back, "hold_back", allow_zero=True))
    came_by = ""
    if handover is not None:
        index, token = handover
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(specs):
            raise ValueError(
                f"handover must be (index of a semaphore of the set, token), got {handover!r}"
            )
        came_by = f"{index + 1}|{validation.check_ticket(token, 'handover')}"
    args: list[Any] = [holder, hold_ms, info, "" if ticket is None else ticket, came_by]
    keys = [None] * len(specs) if fair_keys is None else list(fair_keys)
    if len(keys) != len(specs) or sum(key is not None for key in keys) > 1:
        raise ValueError(
            f"fair_keys must give one value per semaphore ({len(specs)}), at most one of "
            f"them a key (a set takes one fair line), got {fair_keys!r}"
        )
    for spec, (weight, rate_weight), key in zip(specs, weights, keys, strict=True):
        wait_seconds = spec.waiter_lease if wait_lease is None else wait_lease
        wait_ms = int(1000 * validation.check_seconds(wait_seconds, "wait_lease")) if queue else 0
        args += [
            spec.limit,
            spec.lease_ms(lease_timeout),
            wait_ms,
            spec.idle_ms,
            spec.keys.channel,
            spec.dispatch,
            spec.family,
            spec.rate_arg,
            spec.shadow_arg,
            spec.weight_arg(Ask(weight, rate_weight, priority, key, fair_weight)),
        ]
    return args


def parse_joint_acquire(
    specs: Sequence[SemaphoreSpec], reply: Sequence[Any]
) -> tuple[list[Grant] | Places, list[list[Handover]]]:
    """The joint attempt's outcome (a grant per semaphore, or `Places`) and the parked
    waiters it made due in each semaphore."""
    code, *values = reply
    if code == 1:
        if len(values) != len(specs):
            raise ValueError(f"acquire_all.lua granted {len(values)} of {len(specs)}: {reply!r}")
        granted = [read(Granted, row) for row in values]
        return [grant_of(row) for row in granted], [row.handovers for row in granted]
    if code == 0:
        ticket, refused_by, *rows = values
        if len(rows) != len(specs):
            raise ValueError(f"acquire_all.lua answered {len(rows)} of {len(specs)}: {reply!r}")
        refused = [read(Refused, row) for row in rows]
        places = Places(
            int(ticket),
            tuple(spec.binding(place_of(row)) for spec, row in zip(specs, refused, strict=True)),
            tuple(i for i, flag in enumerate(text(refused_by)) if flag == "1"),
        )
        return places, [row.handovers for row in refused]
    if code == 2:
        by, token = values
        raise StaleHandover(specs[int(by) - 1].name, int(token or 0))
    raise ValueError(f"acquire_all.lua answered with unknown code {code!r}")


def joint_problem(
    members: Sequence[tuple[Any, str, SemaphoreSpec]], *, cluster: bool
) -> str | None:
    """Why semaphores (``members``: client, url, spec) cannot be taken in one script
    call, or None. ``cluster``: their client is a Redis Cluster's."""
    if not members:
        return "semaphores must name at least one semaphore"
    client, url, spec = members[0]
    problem = None
    for other_client, other_url, other in members[1:]:
        if other_client is not client and (not other_url or other_url != url):
            problem = (
                f"semaphores must share one Redis client (or URL): {spec.name!r} is on {url}, "
                f"{other.name!r} on {other_url}"
            )
        elif other.namespace != spec.namespace:
            problem = (
                f"semaphores must share one namespace: {spec.name!r} is in {spec.namespace!r}, "
                f"{other.name!r} in {other.namespace!r}"
            )
        if problem:
            return problem
    names = [member[2].name for member in members]
    slots = {
        name: key_slot(s.keys.meta.encode()) for name, (_, _, s) in zip(names, members, strict=True)
    }
    if len(set(names)) < len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        problem = f"semaphores must have distinct names; given twice: {', '.join(twice)}"
    elif cluster and len(set(slots.values())) > 1:
        where = ", ".join(f"{name!r}: slot {slot}" for name, slot in slots.items())
        problem = (
            f"semaphores must have their keys in one Redis Cluster slot to be taken in one "
            f"step, and these are not ({where})"
        )
    elif len({member[2].keys.epoch for member in members}) > 1:
        problem = "semaphores must share one data epoch hash (one Redis, one Cluster slot)"
    return problem
