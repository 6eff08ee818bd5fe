"""What a `LimitedTask` declares: its limits, each on a named semaphore.

The short form names one semaphore and its limits there::

    @app.task(base=LimitedTask, semaphore="partner-api", limit=5, rate="100/m")

The general form lists them, each on a name of its own or a shared one::

    @app.task(base=LimitedTask, limits=[
        Concurrency("partner-api", 5),
        Rate("partner-api", 100, per=60),
        Rate(per_key("account", lambda account, **_: f"account-{account}"), 10, per=60),
    ])

Every limit takes ``weight=``: the permits (or the rate's starts) one task takes, an
int or a function of the task's arguments (``weight=lambda rows, **_: len(rows) // 100 + 1``);
the short form's ``weight=`` applies to its limit and its rate. A task waits until its
whole weight is free, in line order.

Every limit takes ``fair_by=``: a function of the task's arguments naming the account
(tenant, customer) a task is for; the tasks waiting on that semaphore are then served in
turns between the accounts that have tasks waiting, in order within each account, so one
account's backlog does not hold another's first task behind all of it.
``fair_weights=`` (a mapping of account to weight, or a function of the account) gives
an account of weight 3 three turns for every one of an account of weight 1. The
message's ``priority`` orders the line (within an account's turns on a fair limit).

Limits that name the same semaphore are one gate: its concurrency limit and its
rate are granted by one script call, in one line (see "Rates" in
``core/redis/lua/common_meta.lua``). Different names are different gates, all taken in one
step too (`celery_semaphore.admission`, `core.SemaphoreSet`; one after the other on
a Redis Cluster): a task never holds one while it waits for another.
`declared()` turns either form into `Declared` limits, checked, with errors that
name the task; `celery_semaphore.gates` makes them gates per request.

A task body that learns the partner is unhappy (a 429) raises `RateLimited`:
its rates start nobody new for ``retry_after`` seconds, and the task goes back to
the head of their lines.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .core import validation
from .core.rates import RateLimit, parse_rate

Name = str | Callable[..., str]
Weight = int | Callable[..., int]
FairBy = Callable[..., Any]


@dataclass(frozen=True)
class Concurrency:
    """At most ``limit`` tasks at once hold semaphore ``name`` (a name, or a key
    function of the task's arguments: `per_key()`). ``shadow=True``: never refuse,
    only count the tasks it would have made wait (to try a limit before enforcing it).
    ``weight``: the permits one task takes (an int up to ``limit``, or a function of
    the task's arguments returning one; Prefect calls it ``occupy``). ``fair_by``: a
    function of the task's arguments naming its account: waiting tasks are served in
    turns between accounts (``fair_weights``: an account's turns, 1 unless said;
    ``max_per_key``: the most permits of this limit one account holds at once)."""

    name: Name
    limit: int
    shadow: bool = False
    weight: Weight = 1
    fair_by: FairBy | None = None
    fair_weights: validation.FairWeights | None = None
    max_per_key: int | None = None


@dataclass(frozen=True)
class Rate:
    """At most ``count`` starts per ``per`` seconds on semaphore ``name``, cluster-wide,
    ``burst`` at once after an idle spell (1: evenly spaced starts). ``shadow=True``:
    never delay a start, only count those it would have delayed, and by how much.
    ``weight``: the starts one task counts as (an int up to ``burst``, or a function of
    the task's arguments returning one: a batch call that counts as 5 requests).
    ``fair_by``, ``fair_weights``: as for `Concurrency`."""

    name: Name
    count: int
    per: float = 1.0
    burst: int = 1
    shadow: bool = False
    weight: Weight = 1
    fair_by: FairBy | None = None
    fair_weights: validation.FairWeights | None = None


@dataclass(frozen=True)
class Declared:
    """The limits a task declares on one semaphore: the gate it passes per request."""

    name: Name
    limit: int | None
    rate: RateLimit | None
    shadow: frozenset[str] = frozenset()
    #: The permits of ``limit`` and the starts of ``rate`` one task takes.
    weight: Weight = 1
    rate_weight: Weight = 1
    #: Whose turn a task is (a function of its arguments), the accounts' weights, and
    #: the most permits of ``limit`` one account holds at once.
    fair_by: FairBy | None = None
    fair_weights: validation.FairWeights | None = None
    max_per_key: int | None = None


class RateLimited(Exception):
    """Raised by a task body: the rates of its semaphores (or of ``limit``, one
    semaphore's name) start no task for ``retry_after`` seconds, running tasks go
    on, and this task goes back to the head of their lines; its wait is not counted
    against ``max_retries``. Typical after the protected service answered 429::

        if response.status_code == 429:
            raise RateLimited(retry_after=float(response.headers.get("Retry-After", 30)))
    """

    def __init__(self, retry_after: float, limit: str | None = None) -> None:
        self.retry_after = validation.check_seconds(retry_after, "RateLimited(retry_after)")
        if limit is not None:
            validation.check_name(limit, "RateLimited(limit)")
        self.limit = limit
        super().__init__(retry_after, limit)

    def __str__(self) -> str:
        where = f" on {self.limit}" if self.limit else ""
        return f"rate limited{where} for {self.retry_after:g}s"


def declared(task: Any) -> list[Declared]:
    """The limits ``task`` (a `LimitedTask` class or instance) declares, one per
    semaphore name, those without a rate first (see `celery_semaphore.gates`);
    TypeError / ValueError naming the task and the fix."""
    owner = f"task {task.name}"
    spec = _static(task, "semaphore")
    limit, rate, listed = (_static(task, attribute) for attribute in ("limit", "rate", "limits"))
    weight = _static(task, "weight")
    fair_by, fair_weights = _static(task, "fair_by"), _static(task, "fair_weights")
    max_per_key = _static(task, "max_per_key")
    if listed is not None:
        short = (spec, limit, rate, weight, fair_by, fair_weights, max_per_key)
        if any(option is not None for option in short):
            raise TypeError(
                f"{owner}: give either semaphore= with limit=, rate=, weight= and fair_by=, "
                "or limits=[...] (each with its own weight= and fair_by=), not both"
            )
        return _grouped(owner, listed)
    if spec is None:
        raise TypeError(
            f"{owner}: LimitedTask needs semaphore= (a name or a key function) with limit= "
            "and/or rate=, or limits=[Concurrency(...), Rate(...)]"
        )
    if limit is None and rate is None:
        raise TypeError(
            f"{owner}: LimitedTask needs limit= (an int >= 1) or rate= (like '20/s'), or both"
        )
    _check_name(owner, spec)
    if limit is not None:
        validation.check_limit(limit, f"{owner}: limit")
    checked = None if rate is None else parse_rate(rate, f"{owner}: rate")
    weight = 1 if weight is None else weight
    _check_weight(owner, "weight", weight, limit, "limit")
    _check_weight(owner, "weight", weight, None if checked is None else checked.burst, "burst")
    fair = _check_fair(owner, "", fair_by, fair_weights, max_per_key=max_per_key, limit=limit)
    return [Declared(spec, limit, checked, weight=weight, rate_weight=weight, **fair)]


def _grouped(owner: str, listed: Any) -> list[Declared]:
    if not isinstance(listed, list | tuple) or not listed:
        raise TypeError(
            f"{owner}: limits must be a non-empty list of Concurrency(...) and Rate(...), "
            f"got {listed!r}"
        )
    limits: dict[Any, int] = {}
    rates: dict[Any, RateLimit] = {}
    weights: dict[tuple[Any, str], Weight] = {}
    shadow: dict[Any, set[str]] = {}
    fair: dict[Any, dict[str, Any]] = {}
    order: list[Any] = []
    for item in listed:
        if not isinstance(item, Concurrency | Rate):
            raise TypeError(
                f"{owner}: each of limits= must be Concurrency(name, limit) or "
                f"Rate(name, count, per=seconds), got {item!r}"
            )
        _check_name(owner, item.name)
        kind = "Concurrency" if isinstance(item, Concurrency) else "Rate"
        if item.name in (limits if isinstance(item, Concurrency) else rates):
            raise ValueError(
                f"{owner}: two {kind} limits on {item.name!r}; give one, or give them "
                "semaphores of their own"
            )
        if item.name not in order:
            order.append(item.name)
        if not isinstance(item.shadow, bool):
            raise TypeError(f"{owner}: {item!r}: shadow must be True or False")
        if item.shadow:
            shadow.setdefault(item.name, set()).add("limit" if kind == "Concurrency" else "rate")
        if isinstance(item, Concurrency):
            limits[item.name] = validation.check_limit(item.limit, f"{owner}: {item!r}: limit")
            _check_weight(owner, f"{item!r}: weight", item.weight, item.limit, "limit")
        else:
            rates[item.name] = _checked_rate(owner, item)
            _check_weight(owner, f"{item!r}: weight", item.weight, item.burst, "burst")
        weights[(item.name, kind)] = item.weight
        per_key = item.max_per_key if isinstance(item, Concurrency) else None
        if item.fair_by is not None or item.fair_weights is not None or per_key is not None:
            most = item.limit if isinstance(item, Concurrency) else None
            given = _check_fair(
                owner, f"{item!r}: ", item.fair_by, item.fair_weights, max_per_key=per_key,
                limit=most,
            )  # fmt: skip
            known = fair.setdefault(item.name, given)
            if (known["fair_by"], known["fair_weights"]) != (
                given["fair_by"],
                given["fair_weights"],
            ):
                raise ValueError(
                    f"{owner}: the limits on {item.name!r} give different fair_by= or "
                    "fair_weights=; they share one line: give them on one of the limits"
                )
            known["max_per_key"] = known["max_per_key"] or given["max_per_key"]
    found = [
        Declared(
            name,
            limits.get(name),
            rates.get(name),
            frozenset(shadow.get(name, ())),
            weight=weights.get((name, "Concurrency"), 1),
            rate_weight=weights.get((name, "Rate"), 1),
            **fair.get(name, {}),
        )
        for name in order
    ]
    return sorted(found, key=lambda d: d.rate is not None)


def _checked_rate(owner: str, item: Rate) -> RateLimit:
    try:
        return RateLimit(item.count, item.per, item.burst)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{owner}: {item!r}: {error}") from None


def _check_weight(owner: str, what: str, weight: Any, most: int | None, of: str) -> None:
    """A weight is an int from 1 to the limit (or the burst), or a function; a
    function's answers are checked per task (`celery_semaphore.gates`)."""
    if callable(weight) and not isinstance(weight, type):
        return
    validation.check_limit(weight, f"{owner}: {what} (an int or a function of the arguments)")
    if most is not None and weight > most:
        raise ValueError(
            f"{owner}: {what} {weight} is more than the {of} {most}: no task could ever "
            f"start; lower the weight or raise the {of}"
        )


def _check_name(owner: str, name: Any) -> None:
    if not callable(name):
        validation.check_name(name, f"{owner}: semaphore")


def _static(task: Any, attribute: str) -> Any:
    """An option as declared (a key function stays a plain function, not a method)."""
    value = inspect.getattr_static(task, attribute, None)
    return value.__func__ if isinstance(value, staticmethod) else value


def _check_fair(
    owner: str,
    what: str,
    fair_by: Any,
    fair_weights: Any,
    *,
    max_per_key: Any = None,
    limit: int | None = None,
) -> dict[str, Any]:
    """``fair_by`` a function of the task's arguments; ``fair_weights`` a mapping or a
    function of the account, and ``max_per_key`` an int up to the ``limit``, both only
    with ``fair_by``: the `Declared` fields."""
    if fair_by is None:
        for given, option in ((fair_weights, "fair_weights"), (max_per_key, "max_per_key")):
            if given is not None:
                raise TypeError(
                    f"{owner}: {what}{option}= needs fair_by= (a function of the task's "
                    "arguments naming its account)"
                )
        return {}
    if max_per_key is not None:
        if limit is None:
            raise TypeError(
                f"{owner}: {what}max_per_key= caps what one account holds of a concurrency "
                "limit: give it with limit= (or on Concurrency(...))"
            )
        validation.check_limit(max_per_key, f"{owner}: {what}max_per_key")
        if max_per_key > limit:
            raise ValueError(
                f"{owner}: {what}max_per_key {max_per_key} is more than the limit {limit}: "
                "give it at most the limit"
            )
    if not callable(fair_by) or isinstance(fair_by, type):
        raise TypeError(
            f"{owner}: {what}fair_by must be a function of the task's arguments returning "
            f"its account (a str or an int), like lambda account, **_: account; got {fair_by!r}"
        )
    try:
        weights = validation.check_fair_weights(fair_weights)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{owner}: {what}{error}") from None
    return {"fair_by": fair_by, "fair_weights": weights, "max_per_key": max_per_key}
