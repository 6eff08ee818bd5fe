"""Settings, per-task options, the plugin's state per app, and the gate decision (no Redis:
apps on the in-memory broker; clients are made but never connect)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from kombu import Exchange, Queue

import celery_semaphore
from celery_semaphore import LimitedTask
from celery_semaphore.config import SemaphoreConfig, get_config, task_config
from celery_semaphore.formats import GATES_HEADER, Gate, base_queue, encode_gates, recorded_gates
from celery_semaphore.gates import queue_of, request_gates, task_gates
from celery_semaphore.publish import published_queue


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("unit", broker="memory://", set_as_current=False)
    app.conf.semaphore_redis_url = "redis://127.0.0.1:1/0"  # never contacted
    app.finalize()  # tasks defined now are bound at once (not lazy proxies)
    yield app
    celery_semaphore.reset(app)
    app.close()


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"wait_mode": "poll"}, ValueError, "wait_mode must be one of handover, countdown"),
        ({"park_max_bytes": 0}, ValueError, "park_max_bytes must be an int from 1"),
        ({"handover_deadline": 0}, ValueError, "handover_deadline"),
        ({"heartbeat_interval": 60.0, "lease_timeout": 10.0}, ValueError, "shorter than"),
        ({"backoff_jitter": "yes"}, TypeError, "backoff_jitter must be True or False"),
        ({"on_redis_error": "ignore"}, ValueError, "on_redis_error must be one of"),
        ({"queue_limits": {"q": 0}}, ValueError, r"queue_limits\['q'\]"),
    ],
)
def test_bad_settings_are_refused_naming_them(
    options: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        SemaphoreConfig(**options)


def test_app_settings_read_once_and_reset(app: Celery) -> None:
    app.conf.semaphore_max_block = 0.5
    config = get_config(app)
    assert config.max_block == 0.5
    assert get_config(app) is config  # cached on the app, in one object
    app.conf.semaphore_max_block = 0.25
    assert get_config(app).max_block == 0.5
    celery_semaphore.reset(app)
    assert get_config(app).max_block == 0.25


def test_a_misspelt_setting_gets_a_did_you_mean(app: Celery) -> None:
    app.conf.semaphore_wait_mod = "countdown"
    with pytest.raises(ValueError, match="did you mean semaphore_wait_mode"):
        get_config(app)


def test_the_defaults_are_one_per_setting(app: Celery) -> None:
    from celery_semaphore.core import protocol

    config = get_config(app)
    assert config.lease_timeout == protocol.DEFAULT_LEASE_TIMEOUT == 60.0
    assert config.namespace == protocol.DEFAULT_NAMESPACE
    assert config.handover_deadline == protocol.DEFAULT_HANDOVER_DEADLINE
    assert config.wait_mode == "handover"


def test_task_options_override_the_app_and_are_cached_per_app(app: Celery) -> None:
    @app.task(base=LimitedTask, semaphore="s", limit=2, semaphore_wait_mode="countdown",
              shared=False)  # fmt: skip
    def job() -> None: ...

    config = task_config(job)
    assert (config.wait_mode, get_config(app).wait_mode) == ("countdown", "handover")
    assert task_config(job) is config
    celery_semaphore.reset(app)
    assert task_config(job) is not config


def test_queue_of_resolves_the_queue_the_way_the_worker_does() -> None:
    queues = [Queue("reports", Exchange("work"), routing_key="rk.reports"), Queue("default")]
    assert queue_of(queues, "work", "rk.reports") == "reports"
    assert queue_of(queues, Exchange("work"), "rk.reports") == "reports"
    assert queue_of(queues, "", "default") == "default"  # the anonymous exchange
    assert queue_of(queues, "other", "rk.reports") == "rk.reports"
    assert base_queue("reports.semaphore-handover") == "reports"
    assert base_queue("reports") == "reports"
    assert base_queue(None) is None


def test_publish_and_worker_agree_on_the_gates(app: Celery) -> None:
    app.conf.semaphore_queue_limits = {"reports": 2}
    app.conf.task_queues = [Queue("reports", Exchange("work"), routing_key="rk.reports")]

    @app.task(base=LimitedTask, semaphore=lambda key, **_: f"k-{key}", limit=1, shared=False)
    def keyed(key: str) -> None: ...

    queue = published_queue(app, None, "work", "rk.reports")
    assert queue == "reports"
    own = Gate("k-a", 1, keyed.name)
    assert request_gates(keyed, ("a",), {}, queue) == [Gate("queue:reports", 2), own]
    assert request_gates(keyed, ("a",), {}, "default") == [own]


def test_a_failing_key_function_names_the_task(app: Celery) -> None:
    @app.task(base=LimitedTask, semaphore=lambda key: {}[key], limit=1, shared=False,
              name="unit.keyed")  # fmt: skip
    def keyed(key: str) -> None: ...

    with pytest.raises(ValueError, match=r"task unit\.keyed: the semaphore key function"):
        task_gates(keyed, ("missing",), {})

    @app.task(base=LimitedTask, semaphore=lambda key: 3, limit=1, shared=False,
              name="unit.bad")  # fmt: skip
    def bad(key: str) -> None: ...

    with pytest.raises(TypeError, match="must return a non-empty str"):
        task_gates(bad, ("x",), {})


def test_gates_recorded_on_a_request_or_a_revoke_context() -> None:
    raw = encode_gates([Gate("queue:q", 2), Gate("s", 1)])
    assert recorded_gates(SimpleNamespace(request_dict={GATES_HEADER: raw})) == [
        Gate("queue:q", 2),
        Gate("s", 1),
    ]
    assert recorded_gates(SimpleNamespace(headers={GATES_HEADER: raw}))[1] == Gate("s", 1)
    assert recorded_gates(SimpleNamespace()) == []
