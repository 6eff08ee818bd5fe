"""LimitedTask options and settings: validation, key functions, direct calls, eager mode.

Most tests run in this process on a fresh app (eager execution needs no
worker); the last ones run a real ``celery worker`` to show how a bad key
function and a bad setting surface there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery
from cluster_tools import point_client_at

from celery_semaphore import (
    Concurrency,
    LimitedTask,
    Permit,
    Place,
    Rate,
    Semaphore,
    SemaphoreTimeout,
    per_key,
)
from celery_semaphore.formats import Gate
from celery_semaphore.gates import request_gates
from celery_semaphore.state import installed_apps

Make = Callable[..., Celery]


@pytest.fixture
def make_app(redis_url: str) -> Iterator[Make]:
    """Fresh apps on this test's Redis; tasks are ``shared=False`` so no other app gets them."""
    made: list[Celery] = []

    def make(finalized: bool = True, **conf: Any) -> Celery:
        app = Celery(f"opts{len(made)}", set_as_current=False, broker="memory://")
        app.conf.update(semaphore_redis_url=redis_url, **conf)
        if finalized:
            app.finalize()
        made.append(app)
        return app

    yield make
    for app in made:
        installed_apps.discard(app)
        app.close()


@pytest.fixture
def sem(redis_url: str) -> Iterator[Callable[..., Semaphore]]:
    made: list[Semaphore] = []

    def make(name: str, limit: int = 1) -> Semaphore:
        made.append(Semaphore(redis_url, name, limit))
        return made[-1]

    yield make
    for semaphore in made:
        semaphore.close()


def limited(app: Celery, name: str, body: Callable[..., Any] | None = None, **options: Any) -> Any:
    """A bound LimitedTask ``opts.<name>`` running ``body`` (default: return the argument)."""

    def default(self: Any, x: Any = None) -> Any:
        return x

    body = body or default
    body.__name__ = name  # Celery builds the task's signature check from the function's name
    return app.task(bind=True, base=LimitedTask, shared=False, name=f"opts.{name}", **options)(body)


# -- the decorator options --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"limit": 0}, ValueError, r"task opts\.t: limit must be an int from 1 .* got 0"),
        ({"limit": "5"}, TypeError, r"task opts\.t: limit must be an int .* got '5'"),
        ({"limit": True}, TypeError, r"task opts\.t: limit must be an int"),
        ({}, TypeError, r"task opts\.t: LimitedTask needs limit= .* or rate="),
        ({"semaphore": None, "limit": 1}, TypeError, r"task opts\.t: LimitedTask needs semaphore="),
        ({"semaphore": "", "limit": 1}, ValueError, r"task opts\.t: semaphore must be 1 to 200"),
        ({"semaphore": 5, "limit": 1}, TypeError, r"task opts\.t: semaphore must be a str"),
        ({"semaphore": "x" * 201, "limit": 1}, ValueError, r"task opts\.t: semaphore must be"),
        (
            {"limit": 1, "semaphore_lese_timeout": 5},
            ValueError,
            r"task opts\.t: unknown option semaphore_lese_timeout; accepted: .*"
            r"semaphore_lease_timeout",
        ),
        (
            {"limit": 1, "lease_timeout": 5},
            ValueError,
            r"task opts\.t: unknown option lease_timeout; did you mean semaphore_lease_timeout\?",
        ),
        (
            {"limit": 1, "max_waits": 5},
            ValueError,
            r"task opts\.t: unknown option max_waits; did you mean semaphore_max_waits\?",
        ),
        (
            {"limit": 1, "semaphore_redis_url": "redis://elsewhere"},
            ValueError,
            r"task opts\.t: unknown option semaphore_redis_url",
        ),
        (
            {"limit": 1, "semaphore_backoff_max": -1},
            ValueError,
            r"task opts\.t: semaphore_backoff_max must be a number of seconds > 0 .* got -1",
        ),
        (
            {"limit": 1, "semaphore_lease_timeout": "30"},
            TypeError,
            r"task opts\.t: semaphore_lease_timeout must be a number of seconds, got '30'",
        ),
        (
            {"limit": 1, "semaphore_on_redis_error": "ignore"},
            ValueError,
            r"task opts\.t: semaphore_on_redis_error must be one of retry, fail, run",
        ),
        (
            {"limit": 1, "semaphore_max_waits": 0},
            ValueError,
            r"task opts\.t: semaphore_max_waits must be an int from 1",
        ),
        ({"rate": "0/s"}, ValueError, r"task opts\.t: rate must allow at least 1 start .* '0/s'"),
        ({"rate": "5/d"}, ValueError, r"task opts\.t: rate must be a count per second, minute or"),
        ({"rate": 20}, TypeError, r"task opts\.t: rate must be a str like '20/s'"),
        (
            {"limit": 1, "limits": [Rate("s", 5)]},
            TypeError,
            r"task opts\.t: give either semaphore=",
        ),
        ({"semaphore": None, "limits": []}, TypeError, r"task opts\.t: limits must be a non-empty"),
        ({"semaphore": None, "limits": ["s"]}, TypeError, r"each of limits= must be Concurrency"),
        (
            {"semaphore": None, "limits": [Rate("s", 0)]},
            ValueError,
            r"task opts\.t: Rate\(name='s', count=0.*\): rate count must be an int from 1",
        ),
        (
            {"semaphore": None, "limits": [Rate("s", 5, per=0)]},
            ValueError,
            r"task opts\.t: .*rate per must be a number of seconds > 0",
        ),
        (
            {"semaphore": None, "limits": [Concurrency("s", 2), Concurrency("s", 3)]},
            ValueError,
            r"task opts\.t: two Concurrency limits on 's'",
        ),
        (
            {"semaphore": None, "limits": [Concurrency("", 2)]},
            ValueError,
            r"task opts\.t: semaphore must be 1 to 200",
        ),
        (
            {"limit": 2, "weight": 3},
            ValueError,
            r"task opts\.t: weight 3 is more than the limit 2: no task could ever start",
        ),
        (
            {"rate": "5/s", "weight": 2},
            ValueError,
            r"task opts\.t: weight 2 is more than the burst 1: .* raise the burst",
        ),
        (
            {"limit": 2, "weight": "2"},
            TypeError,
            r"task opts\.t: weight \(an int or a function of the arguments\) must be an int",
        ),
        (
            {"semaphore": None, "limits": [Concurrency("s", 2, weight=0)]},
            ValueError,
            r"task opts\.t: Concurrency\(.*\): weight .* must be an int from 1",
        ),
        (
            {"semaphore": None, "limits": [Rate("s", 10, burst=2, weight=3)]},
            ValueError,
            r"task opts\.t: Rate\(.*\): weight 3 is more than the burst 2",
        ),
        (
            {"semaphore": None, "weight": 2, "limits": [Rate("s", 10)]},
            TypeError,
            r"task opts\.t: give either semaphore= with limit=, rate=, weight= and fair_by=, or "
            r"limits=",
        ),
        (
            {"limit": 2, "fair_by": "account"},
            TypeError,
            r"task opts\.t: fair_by must be a function of the task's arguments returning its "
            r"account",
        ),
        (
            {"limit": 2, "fair_weights": {"gold": 3}},
            TypeError,
            r"task opts\.t: fair_weights= needs fair_by=",
        ),
        (
            {"limit": 2, "max_per_key": 1},
            TypeError,
            r"task opts\.t: max_per_key= needs fair_by=",
        ),
        (
            {"limit": 2, "fair_by": lambda a, **_: a, "max_per_key": 3},
            ValueError,
            r"task opts\.t: max_per_key 3 is more than the limit 2",
        ),
        (
            {"rate": "5/s", "fair_by": lambda a, **_: a, "max_per_key": 1},
            TypeError,
            r"task opts\.t: max_per_key= caps what one account holds of a concurrency limit",
        ),
        (
            {"limit": 2, "fair_by": lambda a, **_: a, "fair_weights": {"gold": 0}},
            ValueError,
            r"task opts\.t: fair_weights gives key 'gold' the weight 0: it must be an int",
        ),
        (
            {"limit": 2, "fair_by": lambda a, **_: a, "fair_weights": ["gold"]},
            TypeError,
            r"task opts\.t: fair_weights must be a mapping of key to weight or a function",
        ),
        (
            {
                "semaphore": None,
                "limits": [
                    Concurrency("s", 2, fair_by=lambda a, **_: a),
                    Rate("s", 10, fair_by=lambda b, **_: b),
                ],
            },
            ValueError,
            r"task opts\.t: the limits on 's' give different fair_by= or fair_weights=",
        ),
    ],
)
def test_bad_options_fail_at_decoration_naming_task_and_option(
    make_app: Make, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    options = {"semaphore": "s", **options}
    if options["semaphore"] is None:
        del options["semaphore"]
    with pytest.raises(error, match=message):
        limited(make_app(), "t", **options)


def test_bad_options_of_a_lazy_task_fail_at_first_use(make_app: Make) -> None:
    app = make_app(finalized=False)
    task = limited(app, "lazy", semaphore="s", limit=1, semaphore_lese_timeout=5)
    with pytest.raises(ValueError, match=r"task opts\.lazy: unknown option semaphore_lese_timeout"):
        task.delay()


def test_good_options_are_accepted_and_override_app_settings(make_app: Make) -> None:
    app = make_app(semaphore_backoff_max=30.0, semaphore_max_block=0.5)
    task = limited(app, "good", semaphore="s", limit=3, semaphore_backoff_max=2.0)
    from celery_semaphore.config import task_config

    config = task_config(task)
    assert (config.backoff_max, config.max_block) == (2.0, 0.5)
    assert (task.limit, task.semaphore) == (3, "s")


# -- app settings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "value", "error", "message"),
    [
        (
            "semaphore_backoff_max",
            -1,
            ValueError,
            r"Celery setting semaphore_backoff_max must be a number of seconds > 0",
        ),
        (
            "semaphore_on_redis_error",
            "x",
            ValueError,
            r"Celery setting semaphore_on_redis_error must be one of retry, fail, run, got 'x'",
        ),
        (
            "semaphore_queue_limits",
            {"q": 0},
            ValueError,
            r"Celery setting semaphore_queue_limits\['q'\] must be an int from 1",
        ),
        (
            "semaphore_queue_limits",
            ["q"],
            TypeError,
            r"Celery setting semaphore_queue_limits must be a dict",
        ),
        (
            "semaphore_lease_timeout",
            "60",
            TypeError,
            r"Celery setting semaphore_lease_timeout must be a number of seconds",
        ),
        (
            "semaphore_max_wait",
            10,
            ValueError,
            r"unknown Celery setting semaphore_max_wait\b.*semaphore_max_waits",
        ),
    ],
)
def test_bad_app_settings_fail_the_task_naming_the_setting(
    make_app: Make, setting: str, value: Any, error: type[Exception], message: str
) -> None:
    app = make_app(**{setting: value})
    ran = []
    task = limited(app, "st", lambda self: ran.append(1), semaphore="s", limit=1)
    with pytest.raises(error, match=message):
        task.apply(throw=True)
    assert ran == []


@pytest.mark.parametrize(
    ("conf", "task_options", "message"),
    [
        ({"semaphore_backoff_max": 1800}, {}, r"Celery setting semaphore_backoff_max \(1800s\)"),
        ({}, {"semaphore_backoff_max": 1800}, r"task opts\.vt: semaphore_backoff_max \(1800s\)"),
        (
            {"broker_transport_options": {"visibility_timeout": 600}, "semaphore_max_block": 5},
            {"semaphore_backoff_max": 295},
            r"task opts\.vt: semaphore_backoff_max \(295s\) plus semaphore_max_block \(5s\) "
            r"must stay below half the Redis broker's visibility_timeout \(600s",
        ),
        ({"semaphore_backoff_max": 1798}, {}, None),
        (
            {"broker_transport_options": {"visibility_timeout": 7200}},
            {"semaphore_backoff_max": 3000},
            None,
        ),
        ({"broker_url": "amqp://guest@localhost//", "semaphore_backoff_max": 7200}, {}, None),
    ],
)
def test_backoff_must_stay_far_below_the_redis_brokers_visibility_timeout(
    make_app: Make, conf: dict[str, Any], task_options: dict[str, Any], message: str | None
) -> None:
    """A waiting task's countdown is an ETA message held unacked by its worker: on
    the Redis broker, one held past visibility_timeout is delivered again."""
    app = make_app(**{"broker_url": "redis://127.0.0.1:1/0", **conf})
    task = limited(app, "vt", semaphore="vt", limit=1, **task_options)
    if message is None:
        assert task.apply(args=(1,), throw=True).get() == 1
    else:
        with pytest.raises(ValueError, match=message):
            task.apply(args=(1,), throw=True)


# -- key functions ----------------------------------------------------------------------------


def _raising_key(x: Any) -> str:
    raise LookupError(f"no key for {x!r}")


@pytest.mark.parametrize(
    ("key", "error", "message"),
    [
        (
            _raising_key,
            ValueError,
            r"task opts\.k: the semaphore key function .*_raising_key.* failed on this task's "
            r"arguments: LookupError\(\"no key for 'a'\"\)",
        ),
        (
            lambda x: 5,
            TypeError,
            r"task opts\.k: the semaphore key function must return a non-empty str, got 5",
        ),
        (lambda x: "", TypeError, r"task opts\.k: the semaphore key function .* got ''"),
        (lambda x: "k" * 300, ValueError, r"task opts\.k: semaphore must be 1 to 200 char"),
    ],
)
def test_bad_key_function_result_fails_the_task_naming_task_and_option(
    make_app: Make, key: Callable[..., Any], error: type[Exception], message: str
) -> None:
    ran = []
    app = make_app()
    task = limited(app, "k", lambda self, x: ran.append(x), semaphore=key, limit=1)
    result = task.apply(args=("a",))
    assert result.failed()
    assert isinstance(result.result, error)
    with pytest.raises(error, match=message):
        raise result.result
    assert ran == []


def test_key_function_gives_each_key_its_own_cap(make_app: Make, sem: Any) -> None:
    app = make_app()
    seen: list[Any] = []
    task = limited(
        app,
        "per",
        lambda self, customer: seen.append(sem(f"c-{customer}").status().holders[0].holder),
        semaphore=lambda customer: f"c-{customer}",
        limit=1,
    )
    assert isinstance(sem("c-A").attempt(holder="someone"), Permit)
    assert task.apply(args=("B",)).successful()
    assert task.apply(args=("A",)).failed()
    assert len(seen) == 1
    assert seen[0] != "someone"


# -- direct calls and eager mode --------------------------------------------------------------


def _observer(app: Celery, sem: Any, name: str) -> tuple[Any, list[Any]]:
    """A task that records the holders of its semaphore while its body runs."""
    seen: list[Any] = []

    def body(self: Any, x: Any = None) -> Any:
        seen.append([h.holder for h in sem(name).status().holders])
        if x == "boom":
            raise RuntimeError("boom")
        return x

    task = limited(app, name, body, semaphore=name, limit=1)
    return task, seen


def test_direct_call_bypasses_the_semaphore(make_app: Make, sem: Any) -> None:
    task, seen = _observer(make_app(), sem, "direct")
    sem("direct").attempt(holder="other")
    assert task(7) == 7  # runs although the only permit is taken
    assert seen == [["other"]]
    status = sem("direct").status()
    assert ([h.holder for h in status.holders], status.waiter_count) == (["other"], 0)


def test_apply_takes_and_gives_back_the_permit(make_app: Make, sem: Any) -> None:
    task, seen = _observer(make_app(), sem, "eager")
    result = task.apply(args=(3,))
    assert (result.get(), seen) == (3, [[result.id]])
    failed = task.apply(args=("boom",))
    assert failed.failed()
    assert seen[-1] == [failed.id]
    status = sem("eager").status()
    assert (status.holder_count, status.waiter_count) == (0, 0)


def test_always_eager_takes_and_gives_back_the_permit(make_app: Make, sem: Any) -> None:
    task, seen = _observer(make_app(task_always_eager=True), sem, "always")
    result = task.delay(4)
    assert (result.get(), seen) == (4, [[result.id]])
    assert sem("always").status().holder_count == 0


def test_eager_without_a_free_permit_fails_at_once_without_recursion(
    make_app: Make, sem: Any
) -> None:
    app = make_app(task_always_eager=True)
    task, seen = _observer(app, sem, "full")
    sem("full").attempt(holder="other")
    started = time.monotonic()
    result = task.apply()
    assert result.state == "FAILURE"
    error = result.result
    assert isinstance(error, SemaphoreTimeout)
    assert (error.name, error.limit) == ("full", 1)
    assert "eager execution does not wait" in str(error)
    app.conf.task_eager_propagates = True
    with pytest.raises(SemaphoreTimeout, match=r"semaphore 'full' \(limit 1\)"):
        task.delay()
    assert time.monotonic() - started < 2.0
    assert seen == []
    status = sem("full").status()  # took no place in line, and holds nothing
    assert ([h.holder for h in status.holders], status.waiter_count) == (["other"], 0)


# -- in a real worker -------------------------------------------------------------------------


@pytest.mark.slow
def test_bad_key_function_fails_the_task_in_a_worker(celery_cluster: Any) -> None:
    cluster = point_client_at(celery_cluster(limit=2))
    cluster.worker("w1", concurrency=1)
    tasks = cluster.app_module
    raising, wrong_type, good = (tasks.keyed.delay(m) for m in ("raise", "int", "ok"))
    with pytest.raises(ValueError, match=r"task limited_app\.keyed: the semaphore key function"):
        raising.get(timeout=20)
    assert "LookupError" in str(raising.result)
    with pytest.raises(TypeError, match=r"task limited_app\.keyed: the semaphore key function "):
        wrong_type.get(timeout=20)
    assert good.get(timeout=20) == "ok"
    assert [e["tag"] for e in cluster.events() if e["event"] == "start"] == ["ok"]


@pytest.mark.slow
def test_bad_setting_stops_the_worker_naming_the_setting(celery_cluster: Any) -> None:
    cluster = point_client_at(celery_cluster(limit=2, extra_conf={"semaphore_backoff_max": -1}))
    worker = cluster.worker("w1", concurrency=1, wait=False)
    assert worker.wait_exit(30) != 0
    assert "semaphore_backoff_max must be a number of seconds > 0" in worker.text()


# -- the wait budget counts the waits of the current wait period --------------------------------


@pytest.mark.parametrize(("period_start", "gives_up"), [(0, True), (4, False)])
def test_max_waits_counts_only_the_waits_since_the_tasks_own_last_retry(
    make_app: Make, period_start: int, gives_up: bool
) -> None:
    """A task that waited 4 times, ran, and retried on its own error has waited 0
    times in its new wait period: semaphore_max_waits=3 does not stop it yet."""
    from celery.app.task import Context
    from celery.exceptions import Retry

    from celery_semaphore.admission import Admission, _on_redis_error
    from celery_semaphore.config import task_config
    from celery_semaphore.core import SemaphoreConnectionError
    from celery_semaphore.formats import WAIT_HEADER, Gate, WaitState
    from celery_semaphore.retry import Waits
    from celery_semaphore.state import state_of

    task = limited(make_app(), "budget", semaphore="b", limit=1, semaphore_max_waits=3)
    state_of(task.app).redis_answered.set()  # an outage, not a Redis never reached
    state = {"tickets": {}, "waits": 4, "first_ask": time.time(), "period_start": period_start}
    request = Context(id="t-1", retries=4, headers={}, hostname="h", delivery_info={},
                      args=(), kwargs={}, **{WAIT_HEADER: state})  # fmt: skip
    wait_state = WaitState.of(request)
    admission = Admission.of(task, request, [Gate("b", 1)], task_config(task), wait_state)
    waits = Waits(task, request, wait_state, admission.config, admission.info)
    unreachable = SemaphoreConnectionError("redis://nowhere", "refused")
    if gives_up:
        with pytest.raises(SemaphoreTimeout, match=r"gave up after 4 waits"):
            _on_redis_error(admission, waits, unreachable)
    else:
        with pytest.raises(Retry):
            _on_redis_error(admission, waits, unreachable)


# -- a place refreshed before a long countdown may find the turn come ----------------------------


@pytest.mark.parametrize("gates", [["b"], ["queue:q", "b"]])
def test_a_refreshed_place_that_finds_its_turn_keeps_the_permit(
    make_app: Make, sem: Callable[..., Semaphore], monkeypatch: pytest.MonkeyPatch,
    gates: list[str],
) -> None:  # fmt: skip
    """Refused, a countdown of 10 s (longer than a place holds) refreshes the place
    first; the permit freed meanwhile, so the refresh is granted: the task runs now,
    holding every gate's permit (it used to release that permit and wait 10 s)."""
    from celery.app.task import Context

    from celery_semaphore.admission import Admission, admit
    from celery_semaphore.config import task_config
    from celery_semaphore.formats import Gate, WaitState
    from celery_semaphore.retry import Waits

    task = limited(make_app(), "refresh", semaphore="b", limit=1, semaphore_wait_mode="countdown",
                   semaphore_max_block=0.0, semaphore_backoff_base=10.0,
                   semaphore_backoff_max=20.0, semaphore_backoff_jitter=False)  # fmt: skip
    blocker = sem("b").attempt(holder="blocker")
    assert isinstance(blocker, Permit)
    request = Context(id="t-1", retries=0, headers={}, hostname="h", delivery_info={},
                      args=(), kwargs={})  # fmt: skip
    state = WaitState()
    admission = Admission.of(task, request, [Gate(g, 1) for g in gates], task_config(task), state)
    waits = Waits(task, request, state, admission.config, admission.info)
    decide = waits.decide

    def decide_after_the_blocker_left(*args: Any, **kwargs: Any) -> Any:
        decision = decide(*args, **kwargs)
        blocker.release()
        return decision

    monkeypatch.setattr(waits, "decide", decide_after_the_blocker_left)
    admit(admission, waits)  # no Retry: it holds its permits
    assert sorted(g.name for g in admission.permits) == sorted(gates)
    assert {h.holder for h in sem("b").status().holders} == {"t-1"}
    admission.exit()
    assert sem("b").status().holder_count == 0


def test_the_declared_limits_become_gates_one_per_semaphore(make_app: Make) -> None:
    app = make_app()
    account = per_key("account", lambda account, **_: f"account-{account}")
    task = limited(
        app, "several", limits=[Rate("api", 100, per=60), Concurrency("api", 5), Rate(account, 10)]
    )
    gates = request_gates(task, (), {"account": "a1"}, None)
    assert [(g.name, g.limit, str(g.rate), g.family) for g in gates] == [
        ("api", 5, "100/m", ""),
        ("account-a1", 1_000_000, "10/s", "account"),
    ]
    short = limited(app, "short", semaphore="api", limit=5, rate="100/m")
    assert request_gates(short, (), {}, None) == gates[:1], "the short form is the same gate"
    only_rate = limited(app, "only", semaphore="paced", rate="20/s")
    assert [(g.limit, str(g.rate)) for g in request_gates(only_rate, (), {}, None)] == [
        (1_000_000, "20/s")
    ]


def test_queue_rates_join_the_queue_cap(make_app: Make) -> None:
    app = make_app()
    app.conf.semaphore_queue_limits = {"reports": 2}
    app.conf.semaphore_queue_rates = {"reports": "5/s", "emails": "50/s"}
    task = limited(app, "queued", semaphore="own", limit=1)
    assert [(g.name, g.limit, str(g.rate)) for g in request_gates(task, (), {}, "reports")] == [
        ("own", 1, "None"),
        ("queue:reports", 2, "5/s"),
    ], "the gate with a rate last"
    emails = request_gates(task, (), {}, "emails")
    assert [(g.name, g.limit, str(g.rate)) for g in emails][1] == (
        "queue:emails",
        1_000_000,
        "50/s",
    )


def test_a_bad_queue_rate_names_the_setting(make_app: Make) -> None:
    app = make_app()
    app.conf.semaphore_queue_rates = {"emails": "0/s"}
    with pytest.raises(
        ValueError, match=r"semaphore_queue_rates\['emails'\] must allow at least 1"
    ):
        limited(app, "q", semaphore="s", limit=1).delay()


def test_weights_become_the_gates_weights_per_request(make_app: Make) -> None:
    app = make_app()
    task = limited(
        app, "weighed", limits=[
            Concurrency("api", 5, weight=lambda rows, **_: min(5, len(rows))),
            Rate("api", 100, per=60, burst=10, weight=lambda rows, **_: len(rows)),
            Rate("other", 10),
        ],
    )  # fmt: skip
    api, other = request_gates(task, (), {"rows": [1, 2, 3]}, None)
    assert (api.weight, api.rate_weight, other.weight, other.rate_weight) == (3, 3, 1, 1)
    assert Gate.decode(api.encode()) == api, "the weights travel in the request's headers"
    assert api.encode()[-1] == "3|3"
    assert other.encode() == ["other", 1_000_000, "", "100000|1"], "no weights: as before"
    short = limited(app, "short", semaphore="s", limit=4, weight=2)
    (gate,) = request_gates(short, (), {}, None)
    assert (gate.weight, gate.rate_weight) == (2, 2)


@pytest.mark.parametrize(
    ("weight", "message"),
    [
        (lambda rows: 9, r"task opts\.w: the weight function must return an int from 1 to the "
                         r"limit 4, got 9"),
        (lambda rows: 1 / 0, r"task opts\.w: the weight function .* failed on this task's "
                             r"arguments: ZeroDivisionError"),
        (lambda rows: "2", r"task opts\.w: the weight function must return an int .* got '2'"),
    ],
)  # fmt: skip
def test_a_bad_weight_fails_the_task_naming_it(
    make_app: Make, weight: Callable[..., Any], message: str
) -> None:
    ran = []
    app = make_app()
    task = limited(app, "w", lambda self, rows: ran.append(rows), semaphore="s", limit=4,
                   weight=weight)  # fmt: skip
    result = task.apply(args=([1],))
    assert result.failed()
    with pytest.raises(ValueError, match=message):
        raise result.result
    assert ran == []


# -- how long a refused task waits in place in a busy prefork worker ----------------------------


@pytest.mark.parametrize(("mode", "seconds"), [("handover", None), ("countdown", 1.0)])
def test_in_a_busy_worker_only_a_task_that_would_park_waits_in_place_briefly(
    make_app: Make,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    seconds: float | None,
) -> None:
    """Every other pool process runs a task. A turn 0.4 s away: a task that would park
    (the semaphores' Redis is the broker's own server) does not wait for it in place
    (at most 0.1 s, then it parks); one that would come back with a countdown waits
    the whole max_block (its countdown, aimed half a hold before its turn, would
    bring it back at once, round and round through the broker)."""
    from celery.app.task import Context

    from celery_semaphore.config import task_config
    from celery_semaphore.formats import WaitState
    from celery_semaphore.retry import Waits
    from celery_semaphore.worker import pool_occupancy

    table = pool_occupancy.PoolOccupancy(2)
    monkeypatch.setattr(pool_occupancy, "current", table)
    for index in (1, 0):  # process 1 runs a task; this one (0) is the refused task's
        monkeypatch.setattr(pool_occupancy, "_own_index", lambda i=index: i)
        table.process_started()
        table.started()
    task = limited(make_app(broker_url=redis_url), f"busy_{mode}", semaphore="b", limit=2,
                   semaphore_wait_mode=mode)  # fmt: skip
    request = Context(id="t-1", retries=0, headers={}, hostname="h", delivery_info={},
                      args=(), kwargs={})  # fmt: skip
    state = WaitState()
    waits = Waits(task, request, state, task_config(task), "info")
    place = Place(7, 2, 2, 2, False, None, 0.4, None)  # second in line, 0.2 s a turn
    assert waits.in_place_for(place) == seconds
    monkeypatch.setattr(pool_occupancy, "current", None)  # no table: max_block alone
    assert waits.in_place_for(place) == 1.0
