"""Which semaphores a task request must pass ("gates"): decided here, once.

A request passes the gate of the queue it is consumed from (its cap and rate:
``semaphore_queue_limits``, ``semaphore_queue_rates``), then its task's own
(`LimitedTask`: one per semaphore it names, `celery_semaphore.limits`); the gates
with a rate come last, so a start is spent only once every concurrency
limit has admitted the request. `request_gates()` is the
one decision; both the publisher (places in line at publish) and the worker's
main process (when the message arrives) call it, naming the queue the same
way (`queue_of()`). The worker stores the result in the request's
headers (``celery_semaphore.formats.GATES_HEADER``), so the child, the heartbeat and the
release-by-id paths all agree on the same names.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .config import SemaphoreConfig, get_config
from .core import Semaphore, SemaphoreSet, validation
from .formats import Gate
from .limits import Declared
from .state import state_of

QUEUE_PREFIX = "queue:"

logger = logging.getLogger(__name__)


class KeyFunction:
    """A per-key semaphore function with the family name it declares: see `per_key()`."""

    def __init__(self, family: str, key: Callable[..., str]) -> None:
        self.family = validation.check_name(family, "per_key(family)")
        if not callable(key):
            raise TypeError(
                f"per_key(key) must be a function of the task's arguments returning the "
                f"semaphore's name, got {key!r}"
            )
        self.key = key

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        return self.key(*args, **kwargs)

    def __repr__(self) -> str:
        return f"per_key({self.family!r}, {self.key!r})"


def per_key(family: str, key: Callable[..., str]) -> KeyFunction:
    """A key function for ``LimitedTask(semaphore=...)`` that names its family.

    ``key`` maps the task's arguments to a semaphore name (one semaphore, and one
    cap, per distinct name); ``family`` names all of them together. The metrics
    show a family as one series (``semaphore="<family>"``) instead of one per key,
    unless ``semaphore_metrics_per_key`` is on:

        @app.task(base=LimitedTask, limit=1,
                  semaphore=per_key("customer", lambda customer_id, **_: f"customer-{customer_id}"))
        def sync_customer(customer_id): ...

    A plain function (not wrapped in ``per_key``) gets the task's name as family.
    """
    return KeyFunction(family, key)


def queue_of(queues: Iterable[Any], exchange: Any, routing_key: str | None) -> str | None:
    """The name of the queue among ``queues`` (kombu Queues) that a message sent
    to ``exchange`` with ``routing_key`` lands in; else the routing key (which
    is the queue's name when Celery sends to the default exchange)."""
    exchange_name = getattr(exchange, "name", exchange) or ""
    for queue in queues:
        queue_exchange = queue.exchange.name if queue.exchange is not None else ""
        if queue.routing_key == routing_key and queue_exchange == exchange_name:
            return str(queue.name)
    return routing_key


def queue_gate(queue: str | None, config: SemaphoreConfig, priority: int = 0) -> Gate | None:
    if queue is None or (queue not in config.queue_limits and queue not in config.queue_rates):
        return None
    limit = config.queue_limits.get(queue, validation.MAX_LIMIT)
    return Gate(QUEUE_PREFIX + queue, limit, rate=config.queue_rates.get(queue), priority=priority)


#: Brokers whose lower priority numbers go first (kombu's virtual transports: Redis,
#: SQS, ...; 0 is the most urgent and the default). AMQP (RabbitMQ): higher goes first.
LOWER_FIRST_MOST = 9
AMQP_MOST = 255


def urgency(app: Any, priority: Any) -> int:
    """A message's ``priority`` as a place in a semaphore's line (higher goes first, 0
    for none), with the meaning the app's broker gives the number: on RabbitMQ (AMQP)
    higher is more urgent (0-255), on Redis and kombu's other virtual transports
    lower is (0-9, 0 the most urgent and the default). A number the broker does not
    take is brought into its range, as the broker does, with one WARNING."""
    if priority is None:
        return 0
    amqp = state_of(app).parking.broker_is_amqp(app)
    most = AMQP_MOST if amqp else LOWER_FIRST_MOST
    valid = isinstance(priority, int) and not isinstance(priority, bool)
    if not valid or not 0 <= priority <= most:
        clamped = min(max(int(priority) if valid else 0, 0), most)
        logger.warning(
            "priority %r is outside what the broker takes (0-%d): ordered as %d",
            priority, most, clamped,
        )  # fmt: skip
        priority = clamped
    return int(priority) if amqp else -int(priority)


def task_gates(
    task: Any, args: Sequence[Any], kwargs: Mapping[str, Any], priority: int = 0
) -> list[Gate]:
    """The task's own gates (none for a task that declares no limits); ``priority``:
    its message's, as `urgency()` gives it.

    Raises ValueError / TypeError naming the task when a key function fails.
    """
    declared: list[Declared] = getattr(task, "declared_limits", None) or []
    gates = []
    for limits in declared:
        gate = _gate(task, limits, args, kwargs, priority)
        if limits.max_per_key is not None and gate.fair_key is not None:
            gates.append(account_cap(gate, limits.max_per_key))
        gates.append(gate)
    return gates


#: What the semaphore of a fair limit's per-account cap (``max_per_key``) is named after.
ACCOUNT_CAP = ":account:"


def account_cap(gate: Gate, most: int) -> Gate:
    """The gate of ``max_per_key``: a semaphore of ``most`` permits per account of a
    fair limit, taken before it (a task of an account at its cap waits there, out of
    the shared line, so it holds back no other account), in family
    ``<semaphore>:account`` (one series in the metrics)."""
    name = f"{gate.name}{ACCOUNT_CAP}{gate.fair_key}"
    if len(name) > validation.MAX_NAME_LENGTH:
        digest = hashlib.sha1(str(gate.fair_key).encode()).hexdigest()[:20]
        name = f"{gate.name[:150]}{ACCOUNT_CAP}{digest}"
    family = f"{gate.name[:190]}:account"
    return Gate(name, most, family, priority=gate.priority)


def _gate(
    task: Any, limits: Declared, args: Sequence[Any], kwargs: Mapping[str, Any], priority: int
) -> Gate:
    spec = limits.name
    limit = validation.MAX_LIMIT if limits.limit is None else limits.limit
    if callable(spec):
        try:
            name = spec(*args, **kwargs)
        except Exception as error:
            raise ValueError(
                f"task {task.name}: the semaphore key function {spec!r} failed on this "
                f"task's arguments: {error!r}"
            ) from error
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"task {task.name}: the semaphore key function must return a non-empty str, "
                f"got {name!r}"
            )
        family = spec.family if isinstance(spec, KeyFunction) else task.name
    else:
        name, family = spec, ""
    name = validation.check_name(name, f"task {task.name}: semaphore")
    weight = _weight(task, limits.weight, limit, "limit", args=args, kwargs=kwargs)
    burst = validation.MAX_LIMIT if limits.rate is None else limits.rate.burst
    rate_weight = _weight(task, limits.rate_weight, burst, "burst", args=args, kwargs=kwargs)
    fair_key, fair_weight = None, 1
    if limits.fair_by is not None:
        fair_key, fair_weight = _account(task, limits, args, kwargs)
    return Gate(
        name, limit, family, limits.rate, limits.shadow, weight, rate_weight, priority,
        fair_key, fair_weight,
    )  # fmt: skip


def _account(
    task: Any, limits: Declared, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[str, int]:
    """The account whose turn this request takes on a fair limit, and its weight
    (checked here, naming the task)."""
    try:
        account = limits.fair_by(*args, **kwargs)  # type: ignore[misc]
    except Exception as error:
        raise ValueError(
            f"task {task.name}: the fair_by function {limits.fair_by!r} failed on this "
            f"task's arguments: {error!r}"
        ) from error
    if isinstance(account, int) and not isinstance(account, bool):
        account = str(account)
    try:
        key = validation.check_fair_key(account)
        return key, validation.fair_weight_of(limits.fair_weights, key)
    except ValueError as error:
        raise ValueError(f"task {task.name}: fair_by: {error}") from None


def _weight(
    task: Any, weight: Any, most: int, of: str, *, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> int:
    """The permits (or starts) this request takes: a declared int, or what the weight
    function answers for its arguments (checked here, naming the task)."""
    if isinstance(weight, int):
        return weight
    try:
        value = weight(*args, **kwargs)
    except Exception as error:
        raise ValueError(
            f"task {task.name}: the weight function {weight!r} failed on this task's "
            f"arguments: {error!r}"
        ) from error
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ValueError(
            f"task {task.name}: the weight function must return an int from 1 to the "
            f"{of} {most}, got {value!r}"
        )
    return value


def request_gates(
    task: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    queue: str | None,
    priority: Any = None,
) -> list[Gate]:
    """The gates of one request of ``task`` consumed from ``queue``, in the order
    they are taken (those with a rate last); ``priority``: its message's, as the
    broker gives it (`urgency()`). Raises like `task_gates()`."""
    urgent = urgency(task.app, priority)
    declared = getattr(task, "declared_limits", None)
    known = state_of(task.app).constant_gates
    key = (task.name, queue, urgent)
    cached = known.get(key)
    if cached is not None and cached[0] is declared:
        return list(cached[1])
    queue_gates = [gate for gate in [queue_gate(queue, get_config(task.app), urgent)] if gate]
    gates = sorted(
        queue_gates + task_gates(task, args, kwargs, urgent), key=lambda gate: gate.rate is not None
    )
    if all(_constant(limits) for limits in declared or ()):
        if len(known) >= MOST_CONSTANT_GATES:
            known.clear()
        known[key] = (declared, tuple(gates))
    return gates


#: Requests' gates kept (`request_gates()`), per (task, queue, priority), for tasks
#: whose gates do not depend on their arguments.
MOST_CONSTANT_GATES = 1024


def _constant(limits: Declared) -> bool:
    """Whether every request of a task declaring ``limits`` passes the same gate on it
    (for a given queue and priority): no function of the task's arguments names
    its semaphore, its weights or its account."""
    return (
        isinstance(limits.name, str)
        and isinstance(limits.weight, int)
        and isinstance(limits.rate_weight, int)
        and limits.fair_by is None
    )


def semaphore_of(
    app: Any, gate: Gate, config: SemaphoreConfig, *, quick: bool = False
) -> Semaphore:
    """The gate's semaphore in this process, with ``config`` (the app's or a task's)."""
    return state_of(app).semaphores.get(
        gate.name, gate.limit, config, quick=quick, family=gate.family, rate=gate.rate,
        shadow=gate.shadow,
    )  # fmt: skip


def joint_of(app: Any, gates: Sequence[Gate], config: SemaphoreConfig) -> SemaphoreSet | None:
    """The gates' semaphores as one set, taken in one script call (all or none), or
    None: fewer than two gates, a max_per_key cap among them (taken first, alone), or
    semaphores one call cannot reach together (on a
    Redis Cluster, keys in different slots: see the guarantees page), which are then
    taken one after the other, with a WARNING once per set of names."""
    if len(gates) < 2 or any(ACCOUNT_CAP in gate.name for gate in gates):
        # max_per_key's cap comes first, alone, by design (`account_cap()`): no warning
        return None
    try:
        fair = [gate.name for gate in gates if gate.fair_key is not None]
        if len(fair) > 1:
            raise ValueError(
                f"the fair limits {', '.join(fair)} each order their line by account: one "
                "step takes one ticket for every line, placed by one of them"
            )
        return SemaphoreSet([semaphore_of(app, gate, config) for gate in gates])
    except ValueError as error:
        names = tuple(gate.name for gate in gates)
        warned = state_of(app).joint_warned
        if names not in warned:
            warned.add(names)
            logger.warning(
                "the limits %s are taken one after the other, not in one step: %s",
                ", ".join(names), error,
            )  # fmt: skip
        return None


def disagreeing_limits(app: Any) -> dict[str, list[tuple[str, int]]]:
    """The semaphores that tasks of ``app`` name with different limits: name ->
    [(task name, its limit)], sorted. Key functions are left out (their names are
    known only from a task's arguments)."""
    declared: dict[str, list[tuple[str, int]]] = {}
    for task in list(app.tasks.values()):
        spec = inspect.getattr_static(task, "semaphore", None)
        limit = getattr(task, "limit", None)
        if isinstance(spec, str) and isinstance(limit, int):
            declared.setdefault(spec, []).append((task.name, limit))
    return {
        name: sorted(tasks)
        for name, tasks in sorted(declared.items())
        if len({limit for _, limit in tasks}) > 1
    }


def warn_disagreeing_limits(app: Any) -> None:
    """Once per app and process (at worker start, or at the first publish): a WARNING
    for each semaphore its tasks declare with different limits. The scripts obey
    each caller's own declared limit (see the header of ``core/redis/lua/common_meta.lua``), so
    the limit that applies depends on which task asks: say so."""
    state = state_of(app)
    if state.limits_checked:
        return
    state.limits_checked = True
    for name, tasks in disagreeing_limits(app).items():
        each = [f"{task} (limit {limit})" for task, limit in tasks]
        listed = ", ".join(each[:-1]) + " and " + each[-1]
        logger.warning(
            "celery-semaphore: tasks %s share the semaphore %r with different limits. "
            "Each task is admitted, in its turn, only while fewer than its own limit "
            "hold it, so which limit applies depends on the task that asks; `celery "
            "semaphore status` shows the limit of the last task that asked, and an "
            "operator's `celery semaphore set-limit %s N` applies to all of them. Give "
            "them one limit, or semaphores of their own",
            listed,
            name,
            name,
        )
