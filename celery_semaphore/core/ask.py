"""What one contender asks of a semaphore, as one value: `Ask`.

Every call that takes or keeps a place in line (``attempt``, ``try_acquire``,
``acquire``, ``wait_for_turn``, ``take_place``, ``take_place_or_park``, ``park``)
takes the same five things: how many permits, how many of the rate's starts, how
urgent, and on a fair line whose turn and how heavy that account is. They travel
together as an `Ask`, from the caller to the scripts' argument, so no step can drop
one of them (the per-call ``fair_weight`` was once dropped by four of those calls).

The calls take either ``ask=Ask(...)`` or the same names as keywords
(``sem.acquire(weight=3, fair_key="acme")``); `ask_of()` turns either into the one
value, and the scripts' text is made from it in one place
(``SemaphoreSpec.weight_arg``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypedDict


@dataclass(frozen=True)
class Ask:
    """What a contender asks for.

    ``weight``: the permits it takes at once (a batch that counts as k); ``rate_weight``:
    the rate's starts it spends (None: ``weight``). ``priority`` (-255..255, higher
    first): a new place in line goes ahead of every less urgent waiter. ``fair_key``: the
    account whose turn it takes on a line shared in turns; ``fair_weight``: that
    account's weight here (None: what the semaphore's ``fair_weights`` say). Checked
    against the semaphore (its limit, its burst) when it is asked.
    """

    weight: int = 1
    rate_weight: int | None = None
    priority: int = 0
    fair_key: str | None = None
    fair_weight: int | None = None

    @property
    def starts(self) -> int:
        """The rate's starts it spends."""
        return self.weight if self.rate_weight is None else self.rate_weight


PLAIN = Ask()


class AskFields(TypedDict, total=False):
    """`Ask`'s fields as keyword arguments of the semaphore's calls (typed for mypy)."""

    weight: int
    rate_weight: int | None
    priority: int
    fair_key: str | None
    fair_weight: int | None


FIELDS = frozenset(field.name for field in fields(Ask))


def ask_of(ask: Ask | None, asked: Mapping[str, Any], call: str) -> Ask:
    """The one `Ask` of a call given ``ask=`` or the fields as keywords (``asked``),
    not both; a keyword that is no field is an error naming the call."""
    if not asked:
        if ask is None:
            return PLAIN
        if not isinstance(ask, Ask):
            raise TypeError(f"{call}(ask=...) must be an Ask, got {type(ask).__name__}")
        return ask
    unknown = sorted(set(asked) - FIELDS)
    if unknown:
        raise TypeError(
            f"{call}() got unexpected keyword arguments {', '.join(unknown)}; "
            f"what a contender asks for is {', '.join(sorted(FIELDS))}"
        )
    if ask is not None:
        raise TypeError(
            f"{call}() takes ask= or {', '.join(sorted(asked))}, not both: put them all in the Ask"
        )
    return Ask(**asked)
