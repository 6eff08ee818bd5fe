"""Gates: which semaphores a request must pass, decided once (queue cap first, then
the task's own), named the same by the publisher and the worker, and carried
in the request's headers."""

from __future__ import annotations

import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.app.task import Context
from kombu import Exchange, Queue

from celery_semaphore import LimitedTask, per_key
from celery_semaphore.formats import GATES_HEADER, Gate, decode_gates, encode_gates, recorded_gates
from celery_semaphore.gates import queue_gate, queue_of, request_gates, task_gates
from celery_semaphore.publish import published_queue

MakeApp = Callable[..., Celery]


def finalized(make_app: MakeApp, **conf: Any) -> Celery:
    app = make_app(**conf)
    app.finalize()  # decorators then return tasks, not proxies
    return app


# ---------------------------------------------------------------- encoding


def test_gates_round_trip_through_a_json_header() -> None:
    gates = [Gate("queue:slow", 2), Gate("customer-7", 1, "customer")]
    assert encode_gates(gates) == [["queue:slow", 2], ["customer-7", 1, "customer"]]
    assert decode_gates(encode_gates(gates)) == gates
    assert decode_gates([("s", "3")]) == [Gate("s", 3)]  # as a header may bring it back


@pytest.mark.parametrize("raw", [None, [], ()])
def test_no_gates(raw: Any) -> None:
    assert decode_gates(raw) == []


@pytest.mark.parametrize("raw", [[["s"]], [["s", 1, 2]], [["s", "many"]]])
def test_a_mangled_header_is_an_error_not_a_guess(raw: Any) -> None:
    with pytest.raises(ValueError):
        decode_gates(raw)


# ----------------------------------------------------------------- queues

EXCHANGE = Exchange("jobs", type="direct")
QUEUES = [
    Queue("celery", Exchange("celery"), routing_key="celery"),
    Queue("slow", EXCHANGE, routing_key="slow.key"),
    Queue("slow-copy", Exchange("other"), routing_key="slow.key"),
    Queue("plain"),  # default exchange: routing key '' here
]


@pytest.mark.parametrize(
    ("exchange", "routing_key", "queue"),
    [
        (EXCHANGE, "slow.key", "slow"),
        ("jobs", "slow.key", "slow"),  # the exchange by name
        (Exchange("other"), "slow.key", "slow-copy"),  # same key, other exchange
        ("celery", "celery", "celery"),
        ("", "plain", "plain"),  # default exchange: the routing key is the queue's name
        (None, "plain", "plain"),
        ("jobs", "unknown.key", "unknown.key"),
        ("nowhere", "slow.key", "slow.key"),
        ("", None, None),
    ],
)
def test_queue_of_a_message(exchange: Any, routing_key: str | None, queue: str | None) -> None:
    assert queue_of(QUEUES, exchange, routing_key) == queue


def test_queue_gate_only_for_capped_queues() -> None:
    from celery_semaphore.config import SemaphoreConfig

    config = SemaphoreConfig(queue_limits={"slow": 2})
    assert queue_gate("slow", config) == Gate("queue:slow", 2)
    assert queue_gate("fast", config) is None
    assert queue_gate(None, config) is None


def test_published_queue_else_follows_exchange_and_routing_key(make_app: MakeApp) -> None:
    app = make_app(task_queues=QUEUES)
    assert published_queue(app, None, "jobs", "slow.key") == "slow"
    assert published_queue(app, (), EXCHANGE, "slow.key") == "slow"
    # Celery's ``declare`` names the routed queue even when an explicit exchange and
    # routing key send the message elsewhere: the binding decides, as in the worker.
    assert published_queue(app, [Queue("a"), Queue("b")], "other", "slow.key") == "slow-copy"
    assert published_queue(app, [EXCHANGE], "jobs", "slow.key") == "slow"
    assert published_queue(app, None, "", "anything") == "anything"


# ------------------------------------------------------------ task's gate


def test_a_named_semaphore(make_app: MakeApp) -> None:
    app = finalized(make_app)

    @app.task(base=LimitedTask, semaphore="reports", limit=3, shared=False)
    def report(x: int) -> int:
        return x

    assert task_gates(report, (1,), {}) == [Gate("reports", 3)]


def test_a_key_function_gets_the_tasks_arguments_not_the_task(make_app: MakeApp) -> None:
    app = finalized(make_app)
    seen: list[tuple[Any, ...]] = []

    def key(customer: int, *, region: str = "eu") -> str:
        seen.append((customer, region))
        return f"customer-{customer}-{region}"

    @app.task(base=LimitedTask, semaphore=key, limit=1, shared=False, bind=True)
    def charge(self: Any, customer: int, *, region: str = "eu") -> None: ...

    # a plain key function's semaphores are a family named after the task
    assert task_gates(charge, (7,), {"region": "us"}) == [Gate("customer-7-us", 1, charge.name)]
    assert task_gates(charge, [8], {}) == [Gate("customer-8-eu", 1, charge.name)]
    assert seen == [(7, "us"), (8, "eu")]


def test_key_functions_defined_on_a_subclass(make_app: MakeApp) -> None:
    app = finalized(make_app)

    class PerCustomer(LimitedTask):  # type: ignore[misc]
        abstract = True
        limit = 2

        def semaphore(customer: str) -> str:  # type: ignore[misc]  # no self: a key function
            return f"c-{customer}"

    class PerRegion(LimitedTask):  # type: ignore[misc]
        abstract = True
        limit = 4
        semaphore = staticmethod(lambda region: f"r-{region}")

    @app.task(base=PerCustomer, shared=False)
    def per_customer(customer: str) -> None: ...

    @app.task(base=PerRegion, shared=False)
    def per_region(region: str) -> None: ...

    assert task_gates(per_customer, ("acme",), {}) == [Gate("c-acme", 2, per_customer.name)]
    assert task_gates(per_region, ("eu",), {}) == [Gate("r-eu", 4, per_region.name)]


def test_a_key_function_declares_its_family(make_app: MakeApp) -> None:
    app = finalized(make_app)

    @app.task(
        base=LimitedTask,
        limit=1,
        shared=False,
        semaphore=per_key("customer", lambda customer_id, **_: f"customer-{customer_id}"),
    )
    def sync(customer_id: int) -> None: ...

    assert task_gates(sync, (7,), {}) == [Gate("customer-7", 1, "customer")]
    assert sync.semaphore.family == "customer"


@pytest.mark.parametrize(
    ("family", "key", "error", "message"),
    [
        ("", str, ValueError, "per_key(family) must be 1 to 200 characters"),
        (3, str, TypeError, "per_key(family) must be a str"),
        ("customer", "customer-{id}", TypeError, "per_key(key) must be a function"),
    ],
)
def test_per_key_checks_its_arguments(family: Any, key: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        per_key(family, key)


def test_a_plain_task_has_no_gate_of_its_own(make_app: MakeApp) -> None:
    app = finalized(make_app)

    @app.task(shared=False)
    def plain() -> None: ...

    assert task_gates(plain, (), {}) == []


def test_a_failing_key_function_names_the_task_and_the_error(make_app: MakeApp) -> None:
    app = finalized(make_app)

    def key(order: dict[str, Any]) -> str:
        return str(order["customer"])

    @app.task(base=LimitedTask, semaphore=key, limit=1, shared=False, name="shop.ship")
    def ship(order: dict[str, Any]) -> None: ...

    with pytest.raises(ValueError) as info:
        task_gates(ship, ({"id": 3},), {})
    message = str(info.value)
    assert message.startswith("task shop.ship: the semaphore key function <function ")
    assert message.endswith("failed on this task's arguments: KeyError('customer')")
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(ValueError, match="failed on this task's arguments: TypeError"):
        task_gates(ship, (), {})  # arguments that do not fit the key function


@pytest.mark.parametrize("returned", [5, None, "", b"name", ["a"]])
def test_a_key_function_must_return_a_non_empty_str(make_app: MakeApp, returned: Any) -> None:
    app = finalized(make_app)

    @app.task(base=LimitedTask, semaphore=lambda: returned, limit=1, shared=False, name="shop.bad")
    def bad() -> None: ...

    with pytest.raises(TypeError) as info:
        task_gates(bad, (), {})
    assert str(info.value) == (
        f"task shop.bad: the semaphore key function must return a non-empty str, got {returned!r}"
    )


def test_a_key_function_returning_a_too_long_name(make_app: MakeApp) -> None:
    app = finalized(make_app)

    @app.task(base=LimitedTask, semaphore=lambda: "x" * 201, limit=1, shared=False, name="t.long")
    def long() -> None: ...

    with pytest.raises(ValueError, match=r"^task t.long: semaphore must be 1 to 200 characters"):
        task_gates(long, (), {})


# ----------------------------------------------------------- request gates


def test_queue_cap_comes_before_the_tasks_own(make_app: MakeApp) -> None:
    app = finalized(make_app, semaphore_queue_limits={"slow": 2})

    @app.task(base=LimitedTask, semaphore=lambda n: f"n-{n}", limit=3, shared=False)
    def limited(n: int) -> None: ...

    @app.task(shared=False)
    def plain() -> None: ...

    own = Gate("n-1", 3, limited.name)
    assert request_gates(limited, (1,), {}, "slow") == [Gate("queue:slow", 2), own]
    assert request_gates(limited, (1,), {}, "fast") == [own]
    assert request_gates(limited, (1,), {}, None) == [own]
    assert request_gates(plain, (), {}, "slow") == [Gate("queue:slow", 2)]
    assert request_gates(plain, (), {}, "fast") == []


def test_request_gates_raise_like_task_gates(make_app: MakeApp) -> None:
    app = finalized(make_app, semaphore_queue_limits={"slow": 2})

    @app.task(base=LimitedTask, semaphore=lambda: 1, limit=3, shared=False)
    def limited() -> None: ...

    with pytest.raises(TypeError, match="must return a non-empty str"):
        request_gates(limited, (), {}, "slow")


def test_request_gates_kept_only_where_arguments_cannot_change_them(make_app: MakeApp) -> None:
    """The gates of a task whose gates do not depend on its arguments are made once
    per queue and priority; a key function, a weight function or fair_by is asked
    again for every request."""
    app = finalized(make_app, semaphore_queue_limits={"slow": 2})

    @app.task(base=LimitedTask, semaphore="fixed", limit=3, shared=False)
    def fixed(n: int) -> None: ...

    @app.task(base=LimitedTask, semaphore="weighed", limit=5, weight=lambda n: n, shared=False)
    def weighed(n: int) -> None: ...

    @app.task(base=LimitedTask, semaphore="fair", limit=3, fair_by=lambda n: f"a{n}", shared=False)
    def fair(n: int) -> None: ...

    assert request_gates(fixed, (1,), {}, "slow") == [Gate("queue:slow", 2), Gate("fixed", 3)]
    first = request_gates(fixed, (1,), {}, None, 3)
    again = request_gates(fixed, (2,), {}, None, 3)
    assert first == again == [Gate("fixed", 3, priority=-3)]
    assert first is not again, "each caller gets a list of its own"
    assert request_gates(fixed, (2,), {}, None) == [Gate("fixed", 3)]
    assert request_gates(fixed, (2,), {}, "slow") == [Gate("queue:slow", 2), Gate("fixed", 3)]
    assert [g.weight for g in request_gates(weighed, (2,), {}, None)] == [2]
    assert [g.weight for g in request_gates(weighed, (4,), {}, None)] == [4]
    assert [g.fair_key for g in request_gates(fair, (1,), {}, None)] == ["a1"]
    assert [g.fair_key for g in request_gates(fair, (2,), {}, None)] == ["a2"]


# ---------------------------------------------------------- recorded gates


def test_gates_recorded_on_a_worker_request() -> None:
    request = SimpleNamespace(request_dict={GATES_HEADER: [["queue:q", 1], ["s", 2]]})
    assert recorded_gates(request) == [Gate("queue:q", 1), Gate("s", 2)]


def test_gates_on_the_childs_context_or_a_revoke() -> None:
    context = Context(id="t1", **{GATES_HEADER: [["s", 2]]})
    assert recorded_gates(context) == [Gate("s", 2)]
    in_headers = Context(id="t2", headers={GATES_HEADER: [["q", 5]]})
    assert recorded_gates(in_headers) == [Gate("q", 5)]


def test_the_request_dict_wins_and_falls_back_when_it_has_no_gates() -> None:
    both = SimpleNamespace(
        request_dict={GATES_HEADER: [["a", 1]]}, headers={GATES_HEADER: [["b", 1]]}
    )
    assert recorded_gates(both) == [Gate("a", 1)]
    fallback = SimpleNamespace(request_dict={"id": "x"}, headers={GATES_HEADER: [["b", 1]]})
    assert recorded_gates(fallback) == [Gate("b", 1)]


@pytest.mark.parametrize(
    "request_",
    [SimpleNamespace(), Context(id="x"), SimpleNamespace(headers=None, request_dict=None)],
)
def test_no_gates_recorded(request_: Any) -> None:
    assert recorded_gates(request_) == []


# ------------------------------------------------------ fair share and priority


def test_a_gate_carries_its_priority_and_account_through_the_header() -> None:
    gates = [
        Gate("plain", 2),
        Gate("urgent", 2, priority=5),
        Gate("fair", 2, priority=-3, fair_key="acme|eu", fair_weight=3),
        Gate("fair-plain", 2, fair_key=""),
    ]
    encoded = encode_gates(gates)
    assert encoded[0] == ["plain", 2] and encoded[1][-1] == "5"
    assert encoded[2][-1] == "-3|3|acme|eu", "the account is last: it may hold '|'"
    assert decode_gates(encoded) == gates


def test_the_brokers_priority_becomes_a_place_in_line(make_app: MakeApp) -> None:
    from celery_semaphore.gates import urgency

    redis_app = make_app(broker_url="redis://127.0.0.1:6379/0")
    assert [urgency(redis_app, p) for p in (None, 0, 3, 9)] == [0, 0, -3, -9], "lower first"
    amqp_app = make_app(broker_url="amqp://guest:guest@127.0.0.1:5672//")
    assert [urgency(amqp_app, p) for p in (None, 0, 3, 255)] == [0, 0, 3, 255], "higher first"


def test_a_priority_the_broker_does_not_take_is_brought_into_its_range(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    from celery_semaphore.gates import urgency

    app = make_app(broker_url="redis://127.0.0.1:6379/0")
    assert urgency(app, -1) == 0 and urgency(app, 12) == -9 and urgency(app, "x") == 0
    assert "priority -1 is outside what the broker takes (0-9): ordered as 0" in caplog.text


def test_fair_by_names_the_account_and_its_weight(make_app: MakeApp) -> None:
    app = finalized(make_app)

    @app.task(base=LimitedTask, semaphore="api", limit=4, fair_by=lambda account, **_: account,
              fair_weights={"gold": 3})  # fmt: skip
    def named_account(account: Any) -> None: ...

    assert task_gates(named_account, ("gold",), {}, 2) == [
        Gate("api", 4, priority=2, fair_key="gold", fair_weight=3)
    ]
    assert task_gates(named_account, (7,), {})[0].fair_key == "7", "an int account is its text"
    with pytest.raises(ValueError, match=r"fair_by: fair_key must be a str"):
        task_gates(named_account, (None,), {})


def test_a_fair_weights_function_is_asked_per_task(make_app: MakeApp) -> None:
    app = finalized(make_app)

    @app.task(base=LimitedTask, semaphore="api", limit=4, fair_by=lambda account, **_: account,
              fair_weights=lambda account: {"gold": 3, "bad": 0}.get(account, 1))  # fmt: skip
    def weighed_account(account: Any) -> None: ...

    assert task_gates(weighed_account, ("gold",), {})[0].fair_weight == 3
    assert task_gates(weighed_account, ("tin",), {})[0].fair_weight == 1
    with pytest.raises(ValueError, match=r"fair_weights gives key 'bad' the weight 0"):
        task_gates(weighed_account, ("bad",), {})


def test_two_fair_limits_or_an_account_cap_are_taken_apart(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    from celery_semaphore.config import get_config
    from celery_semaphore.gates import joint_of

    app = make_app()
    two_fair = [Gate("shared", 4, fair_key="acme"), Gate("region", 2, fair_key="eu")]
    capped = [Gate("shared:account:acme", 1, "shared:account"), Gate("shared", 4, fair_key="acme")]
    for gates in (two_fair, two_fair, capped):
        assert joint_of(app, gates, get_config(app)) is None
    warnings = [r.getMessage() for r in caplog.records if "one after the other" in r.getMessage()]
    assert warnings == [
        "the limits shared, region are taken one after the other, not in one step: the fair "
        "limits shared, region each order their line by account: one step takes one ticket "
        "for every line, placed by one of them",
    ], "once; and none for max_per_key's cap, which comes first by design (one per account)"


def test_max_per_key_puts_a_per_account_cap_before_the_fair_limit(make_app: MakeApp) -> None:
    app = finalized(make_app)

    @app.task(base=LimitedTask, semaphore="api", limit=4, fair_by=lambda account, **_: account,
              max_per_key=2)  # fmt: skip
    def capped_account(account: Any) -> None: ...

    assert task_gates(capped_account, ("acme",), {}, 3) == [
        Gate("api:account:acme", 2, "api:account", priority=3),
        Gate("api", 4, priority=3, fair_key="acme"),
    ]
    long_key = "x" * 300
    with pytest.raises(ValueError, match="fair_key must be a str of at most 200"):
        task_gates(capped_account, (long_key,), {})
    cap = task_gates(capped_account, ("y" * 190,), {})[0]
    assert len(cap.name) <= 200 and cap.name.startswith("api:account:"), "a digest if long"
