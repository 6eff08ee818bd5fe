"""Argument checks at the public edge; messages name the argument and what is accepted."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

MAX_NAME_LENGTH = 200
MAX_LIMIT = 1_000_000
MAX_SECONDS = 7 * 24 * 3600.0


def check_name(name: Any, argument: str = "name") -> str:
    if not isinstance(name, str):
        raise TypeError(f"{argument} must be a str, got {type(name).__name__}")
    if not name or len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"{argument} must be 1 to {MAX_NAME_LENGTH} characters long, got {len(name)}"
        )
    return name


#: A namespace with braces holds one Redis Cluster hash tag, and nothing else in braces.
_NAMESPACE_TAG = re.compile(r"[^{}]*(\{[^{}]+\}[^{}]*)?")


def check_namespace(namespace: Any) -> str:
    """A namespace may hold one hash tag (``"celery_semaphore{limits}"``): every
    semaphore of it is then on one Redis Cluster slot (see `core.keys`)."""
    check_name(namespace, "namespace")
    if not _NAMESPACE_TAG.fullmatch(namespace):
        raise ValueError(
            f"namespace may contain braces only as one Redis Cluster hash tag, like "
            f"'celery_semaphore{{limits}}' (all its semaphores on one slot), got {namespace!r}"
        )
    return str(namespace)


def check_limit(limit: Any, argument: str = "limit") -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"{argument} must be an int from 1 to {MAX_LIMIT}, got {limit!r}")
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"{argument} must be an int from 1 to {MAX_LIMIT}, got {limit}")
    return limit


def check_seconds(value: Any, argument: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{argument} must be a number of seconds, got {value!r}")
    low_ok = value >= 0 if allow_zero else value > 0
    if not low_ok or math.isnan(value) or value > MAX_SECONDS:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(
            f"{argument} must be a number of seconds {bound} and at most {MAX_SECONDS:.0f}, "
            f"got {value!r}"
        )
    return float(value)


def check_holder(holder: Any, argument: str = "holder") -> str:
    check_name(holder, argument)
    if "\0" in holder:
        raise ValueError(f"{argument} must not contain NUL characters, got {holder!r}")
    return str(holder)


def check_weights(
    weight: Any, rate_weight: Any, name: str, limit: int, burst: int | None
) -> tuple[int, int]:
    """(permits, rate grants) a contender asks for at once; ``rate_weight`` None: as
    ``weight``. Each must fit in the semaphore's limit and its rate's burst, or it
    could never be granted."""
    for value, argument in ((weight, "weight"), (rate_weight, "rate_weight")):
        if argument == "rate_weight" and value is None:
            continue
        check_limit(value, argument)
    grants = weight if rate_weight is None else rate_weight
    if weight > limit:
        raise ValueError(
            f"weight {weight} is more than the limit {limit} of semaphore {name!r}: it "
            f"could never be granted (raise the limit or lower the weight)"
        )
    if burst is not None and grants > burst:
        raise ValueError(
            f"rate weight {grants} is more than the burst {burst} of semaphore {name!r}'s "
            f"rate: it could never be granted (give the rate burst={grants} or more)"
        )
    return weight, grants


def check_ticket(ticket: Any, what: str = "ticket") -> int | None:
    if ticket is None:
        return None
    if isinstance(ticket, bool) or not isinstance(ticket, int) or ticket <= 0:
        source = "a refused attempt" if what == "ticket" else "the Handover"
        raise ValueError(
            f"{what} must be None or the positive int {source} returned, got {ticket!r}"
        )
    return ticket


def check_info(info: Any) -> str:
    if not isinstance(info, str):
        raise TypeError(f"info must be a str, got {type(info).__name__}")
    return info


SHADOW_KINDS = ("limit", "rate")


def check_shadow(shadow: Any) -> list[str]:
    """The limits of a semaphore that only count, never refuse: some of "limit", "rate"."""
    if isinstance(shadow, str) or not hasattr(shadow, "__iter__"):
        raise TypeError(
            f"shadow must be a list of {' and '.join(map(repr, SHADOW_KINDS))}, got {shadow!r}"
        )
    kinds = list(shadow)
    for kind in kinds:
        if kind not in SHADOW_KINDS:
            raise ValueError(
                f"shadow must list only {' and '.join(map(repr, SHADOW_KINDS))}, got {kind!r}"
            )
    return kinds


#: A fair limit's weights: key -> its share (a key not in the mapping has 1), or a
#: function of the key.
FairWeights = Mapping[str, int] | Callable[[str], int]
MAX_FAIR_WEIGHT = 1000
MAX_PRIORITY = 255
MAX_FAIR_KEY = 200


def check_priority(priority: Any) -> int:
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not -MAX_PRIORITY <= priority <= MAX_PRIORITY
    ):
        raise ValueError(
            f"priority must be an int from {-MAX_PRIORITY} to {MAX_PRIORITY} (higher goes "
            f"first; 0 is the default), got {priority!r}"
        )
    return priority


def check_fair_key(key: Any) -> str:
    if not isinstance(key, str) or len(key) > MAX_FAIR_KEY:
        raise ValueError(
            f"fair_key must be a str of at most {MAX_FAIR_KEY} characters (the account, "
            f"tenant or customer whose turn it is), got {key!r}"
        )
    return key


def check_fair_weight(weight: Any, key: str) -> int:
    valid = isinstance(weight, int) and not isinstance(weight, bool)
    if not valid or not 1 <= weight <= MAX_FAIR_WEIGHT:
        raise ValueError(
            f"fair_weights gives key {key!r} the weight {weight!r}: it must be an int from "
            f"1 to {MAX_FAIR_WEIGHT} (its turns for every one of a key of weight 1)"
        )
    return int(weight)


def check_fair_weights(weights: Any) -> FairWeights | None:
    if weights is None or callable(weights):
        return weights  # type: ignore[no-any-return]
    if not isinstance(weights, Mapping):
        raise TypeError(
            f"fair_weights must be a mapping of key to weight or a function of the key, "
            f"got {type(weights).__name__}"
        )
    for key, weight in weights.items():
        check_fair_weight(weight, check_fair_key(key))
    return dict(weights)


def fair_weight_of(weights: FairWeights | None, key: str) -> int:
    """``key``'s weight under ``weights`` (1 unless they say otherwise)."""
    if weights is None:
        return 1
    if isinstance(weights, Mapping):
        return int(weights.get(key, 1))
    try:
        weight = weights(key)
    except Exception as error:
        raise ValueError(
            f"fair_weights raised {type(error).__name__}: {error} for key {key!r} "
            f"(it must answer an int from 1 to {MAX_FAIR_WEIGHT} for every key)"
        ) from error
    return check_fair_weight(weight, key)
