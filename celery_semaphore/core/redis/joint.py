"""When semaphores can be taken together in one step (acquire_all.lua): one client,
one namespace, one Redis Cluster slot. Its arguments and reply are in
`celery_semaphore.core.redis.arguments`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.crc import key_slot

from celery_semaphore.core.protocol import SemaphoreSpec

from .keys import keys_of


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
        name: key_slot(keys_of(s.namespace, s.name).meta.encode())
        for name, (_, _, s) in zip(names, members, strict=True)
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
    elif len({keys_of(m.namespace, m.name, cluster).epoch for _, _, m in members}) > 1:
        problem = "semaphores must share one data epoch hash (one Redis, one Cluster slot)"
    return problem
