"""Settings: defaults, validation at the edge (messages naming the setting or task
option and the fix), misspelt names, per-task overrides, the backoff versus the
Redis broker's visibility_timeout, and the cache per app."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import pytest
from celery import Celery

import celery_semaphore.config
from celery_semaphore import LimitedTask
from celery_semaphore.config import (
    APP_WIDE,
    DEFAULT_REDIS_URL,
    SemaphoreConfig,
    check_backoff,
    check_shared_redis,
    default_redis_url,
    get_config,
    task_config,
    visibility_timeout,
)
from celery_semaphore.state import reset

MakeApp = Callable[..., Celery]


def test_defaults_are_the_documented_ones() -> None:
    config = SemaphoreConfig()
    assert config == SemaphoreConfig(
        redis_url="redis://localhost:6379/0",
        namespace="celery_semaphore",
        lease_timeout=60.0,
        heartbeat_interval=None,
        backoff_base=0.5,
        backoff_max=60.0,
        backoff_jitter=True,
        max_block=1.0,
        max_waits=None,
        max_wait_time=None,
        on_redis_error="retry",
        queue_limits={},
        send_events=None,
    )
    assert config.renew_every == 15.0  # a quarter of the lease


def test_every_setting_is_documented_in_the_module() -> None:
    import celery_semaphore.config as module

    assert module.__doc__ is not None
    missing = [
        f.name for f in fields(SemaphoreConfig) if f"semaphore_{f.name}" not in module.__doc__
    ]
    assert missing == []


def test_heartbeat_interval_sets_how_often_leases_are_renewed() -> None:
    assert SemaphoreConfig(lease_timeout=30, heartbeat_interval=5).renew_every == 5


BAD_VALUES = [
    ({"namespace": "a{b"}, ValueError, "namespace may contain braces only as one"),
    ({"lease_timeout": 0}, ValueError, "lease_timeout must be a number of seconds > 0"),
    ({"heartbeat_interval": -1}, ValueError, "heartbeat_interval must be a number of seconds"),
    ({"heartbeat_interval": 60}, ValueError,
     "heartbeat_interval (60s) must be shorter than lease_timeout (60.0s), or leases run out"),
    ({"backoff_base": "1"}, TypeError, "backoff_base must be a number of seconds"),
    ({"backoff_max": 0}, ValueError, "backoff_max must be a number of seconds > 0"),
    ({"max_block": -0.1}, ValueError, "max_block must be a number of seconds >= 0"),
    ({"max_waits": 0}, ValueError, "max_waits must be an int from 1"),
    ({"max_waits": 2.5}, TypeError, "max_waits must be an int from 1"),
    ({"max_wait_time": 0}, ValueError, "max_wait_time must be a number of seconds > 0"),
    ({"on_redis_error": "ignore"}, ValueError,
     "on_redis_error must be one of retry, fail, run, got 'ignore'"),
    ({"backoff_jitter": "yes"}, TypeError, "backoff_jitter must be True or False, got 'yes'"),
    ({"send_events": 1}, TypeError, "send_events must be True, False or None, got 1"),
    ({"queue_limits": [("q", 1)]}, TypeError, "queue_limits must be a dict of queue name -> limit"),
    ({"queue_limits": {"": 1}}, ValueError, "queue_limits key must be 1 to 200 characters"),
    ({"queue_limits": {"q": 0}}, ValueError, "queue_limits['q'] must be an int from 1"),
    ({"queue_limits": {"q": "2"}}, TypeError, "queue_limits['q'] must be an int from 1"),
]  # fmt: skip
BAD_IDS = [next(iter(values)) + f"-{i}" for i, (values, _, _) in enumerate(BAD_VALUES)]


@pytest.mark.parametrize(("values", "error", "words"), BAD_VALUES, ids=BAD_IDS)
def test_bad_values_name_the_setting(
    values: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as info:
        SemaphoreConfig(**values)
    assert str(info.value).startswith(words)


@pytest.mark.parametrize(("values", "error", "words"), BAD_VALUES, ids=BAD_IDS)
def test_bad_app_settings_name_the_celery_setting(
    make_app: MakeApp, values: dict[str, Any], error: type[Exception], words: str
) -> None:
    app = make_app(**{f"semaphore_{k}": v for k, v in values.items()})
    with pytest.raises(error) as info:
        get_config(app)
    assert str(info.value).startswith(f"Celery setting semaphore_{words}")
    with pytest.raises(error):  # nothing cached: the next use raises again
        get_config(app)


# ------------------------------------------------------------ app settings


def test_settings_are_read_once_and_cached(make_app: MakeApp) -> None:
    app = make_app(semaphore_lease_timeout=30, semaphore_queue_limits={"slow": 2})
    config = get_config(app)
    assert (config.lease_timeout, config.queue_limits) == (30, {"slow": 2})
    app.conf.semaphore_lease_timeout = 10
    assert get_config(app) is config  # read once
    reset(app)
    assert get_config(app).lease_timeout == 10  # reset: read again


def test_a_setting_set_to_none_keeps_the_default(make_app: MakeApp) -> None:
    app = make_app(semaphore_lease_timeout=None, semaphore_namespace=None)
    config = get_config(app)
    assert (config.lease_timeout, config.namespace) == (60.0, "celery_semaphore")


@pytest.mark.parametrize(
    ("setting", "suggestion"),
    [
        ("semaphore_lease_timout", "semaphore_lease_timeout"),
        ("semaphore_max_wait", "semaphore_max_waits"),
        ("semaphore_queue_limit", "semaphore_queue_limits"),
        ("semaphore_redis", "semaphore_redis_url"),
    ],
)
def test_a_misspelt_setting_is_an_error_with_a_suggestion(
    make_app: MakeApp, setting: str, suggestion: str
) -> None:
    app = make_app(**{setting: 5})
    with pytest.raises(ValueError, match=f"^unknown Celery setting {setting}; ") as info:
        get_config(app)
    assert f"did you mean {suggestion}? " in str(info.value)
    assert "known: semaphore_url, semaphore_redis_url, semaphore_namespace," in str(info.value)


def test_an_unknown_setting_without_a_close_match_lists_the_known_ones(make_app: MakeApp) -> None:
    setting = "semaphore_" + "z" * 30
    app = make_app(**{setting: 1})
    with pytest.raises(ValueError, match=rf"^unknown Celery setting {setting}; known: ") as info:
        get_config(app)
    assert "did you mean" not in str(info.value)


def test_settings_under_a_django_style_namespace_are_read(make_app: MakeApp) -> None:
    class Settings:
        CELERY_BROKER_URL = "memory://"
        CELERY_SEMAPHORE_LEASE_TIMEOUT = 12
        CELERY_SEMAPHORE_WAIT_MODE = "countdown"

    app = make_app()
    app.config_from_object(Settings, namespace="CELERY")
    config = get_config(app)
    assert (config.lease_timeout, config.wait_mode) == (12, "countdown")


def test_a_misspelt_setting_raises_at_apply_async_not_later(make_app: MakeApp) -> None:
    """Not swallowed by Celery's signal dispatcher: publishing a LimitedTask reads
    the settings first (in handover mode, to decide whether to park)."""
    app = make_app(semaphore_max_blok=1.0)

    @app.task(base=LimitedTask, semaphore="s", limit=1, shared=False)
    def job() -> None: ...

    with pytest.raises(ValueError, match="did you mean semaphore_max_block"):
        job.delay()


def test_a_misspelt_setting_under_a_django_style_namespace_is_an_error(
    make_app: MakeApp,
) -> None:
    class Settings:
        CELERY_BROKER_URL = "memory://"
        CELERY_SEMAPHORE_LEASE_TIMOUT = 12

    app = make_app()
    app.config_from_object(Settings, namespace="CELERY")
    with pytest.raises(ValueError, match="did you mean CELERY_SEMAPHORE_LEASE_TIMEOUT"):
        get_config(app)


@pytest.mark.parametrize(
    ("broker", "url"),
    [
        ("redis://broker:6379/1", "redis://broker:6379/1"),
        ("rediss://:pw@broker:6380/0", "rediss://:pw@broker:6380/0"),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
        ("redis://a:6379/0;redis://b:6379/0", "redis://a:6379/0"),  # failover list: the first
        ("amqp://guest@rabbit//", DEFAULT_REDIS_URL),
        ("memory://", DEFAULT_REDIS_URL),
        (None, DEFAULT_REDIS_URL),
    ],
)
def test_default_redis_url_is_the_broker_if_it_is_redis(
    make_app: MakeApp, broker: str | None, url: str
) -> None:
    app = make_app(broker_url=broker)
    assert default_redis_url(app) == url
    assert get_config(app).redis_url == url


def test_an_explicit_redis_url_wins_over_the_broker(make_app: MakeApp) -> None:
    app = make_app(broker_url="redis://broker/1", semaphore_redis_url="redis://sem/2")
    assert get_config(app).redis_url == "redis://sem/2"


# ------------------------------------------------------------ retired settings

RETIRED_WARNING = "celery-semaphore: the setting semaphore_park_without_persistence is retired"


def retired_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if RETIRED_WARNING in r.getMessage()]


@pytest.fixture
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a process that has not met a retired setting yet."""
    monkeypatch.setattr(celery_semaphore.config, "_retired_warned", set())


@pytest.mark.usefixtures("fresh_process")
def test_the_retired_opt_in_is_accepted_ignored_and_named_in_one_warning_per_process(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    """semaphore_park_without_persistence, app-wide or a task's option, any value (it
    was a bool; nothing reads it now): the settings read as without it, and the
    process says so once, whatever reads them and however often."""
    apps = [make_app(semaphore_park_without_persistence=v) for v in (True, False, "yes")]
    plain = make_app(semaphore_redis_url="redis://r/0")
    plain.finalize()

    @plain.task(base=LimitedTask, semaphore="s", limit=1, shared=False,
                semaphore_park_without_persistence=True)  # fmt: skip
    def limited() -> None: ...

    configs = [get_config(app) for app in apps]
    assert configs == [SemaphoreConfig()] * 3
    assert task_config(limited) == get_config(plain) == SemaphoreConfig(redis_url="redis://r/0")
    reset(apps[0])
    get_config(apps[0])  # read again: no second warning
    (record,) = retired_warnings(caplog)
    assert record.levelno == logging.WARNING
    assert record.name == "celery_semaphore.config"
    message = record.getMessage()
    assert "is retired and ignored" in message
    assert "on RabbitMQ and Redis brokers waiting tasks park in the broker's own server" in message
    assert "park only in a Redis that keeps every write (appendonly yes)" in message
    assert "else they wait as countdown retries" in message
    assert message.endswith("Remove it (from the Celery settings and from every task's options)")


@pytest.mark.usefixtures("fresh_process")
def test_a_tasks_retired_option_alone_is_named_once_too(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(semaphore_redis_url="redis://r/0")
    app.finalize()

    def job() -> None: ...

    tasks = [
        app.task(base=LimitedTask, semaphore="s", limit=1, shared=False, name=f"t{i}",
                 semaphore_park_without_persistence=True)(job)
        for i in range(3)
    ]  # fmt: skip
    assert retired_warnings(caplog) == []  # declared: nothing read yet
    assert all(task_config(task).park_without_persistence is None for task in tasks)
    assert len(retired_warnings(caplog)) == 1


def test_settings_without_a_retired_one_say_nothing(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture, fresh_process: None
) -> None:
    get_config(make_app(semaphore_lease_timeout=30))
    assert retired_warnings(caplog) == []


# ------------------------------------------------ backoff vs visibility_timeout


@pytest.mark.parametrize(
    ("broker", "options", "timeout"),
    [
        ("redis://b", {}, 3600.0),
        ("redis://b", {"visibility_timeout": 300}, 300.0),
        ("rediss://b", {"visibility_timeout": 50.5}, 50.5),
        ("sentinel://s:26379", {"visibility_timeout": 100}, 100.0),
        ("redis+socket:///run/r.sock", {}, 3600.0),
        ("amqp://rabbit", {"visibility_timeout": 10}, None),  # no redelivery on RabbitMQ
        ("memory://", {}, None),
    ],
)
def test_visibility_timeout_of_the_broker(
    make_app: MakeApp, broker: str, options: dict[str, Any], timeout: float | None
) -> None:
    app = make_app(broker_url=broker, broker_transport_options=options)
    assert visibility_timeout(app) == timeout


def test_backoff_must_stay_below_half_the_visibility_timeout(make_app: MakeApp) -> None:
    app = make_app(broker_url="redis://b", broker_transport_options={"visibility_timeout": 122})
    check_backoff(app, SemaphoreConfig(backoff_max=59.9, max_block=1), "x: ")  # 60.9 < 61
    with pytest.raises(ValueError) as info:
        check_backoff(app, SemaphoreConfig(backoff_max=60, max_block=1), "task t: semaphore_")
    assert str(info.value).startswith(
        "task t: semaphore_backoff_max (60s) plus semaphore_max_block (1s) must stay below half "
        "the Redis broker's visibility_timeout (122s, broker_transport_options)"
    )
    assert "the task would run twice" in str(info.value)


def test_app_settings_are_checked_against_the_visibility_timeout(make_app: MakeApp) -> None:
    app = make_app(
        broker_url="redis://b",
        broker_transport_options={"visibility_timeout": 100},
        semaphore_backoff_max=60,
    )
    with pytest.raises(ValueError, match=r"^Celery setting semaphore_backoff_max \(60s\) plus"):
        get_config(app)


def test_no_check_on_a_broker_that_does_not_redeliver(make_app: MakeApp) -> None:
    app = make_app(broker_url="amqp://rabbit", semaphore_backoff_max=7 * 24 * 3600)
    assert get_config(app).backoff_max == 7 * 24 * 3600


# ---------------------------------------------------------- per-task options


def test_with_options_overrides_and_leaves_the_original_alone() -> None:
    base = SemaphoreConfig(lease_timeout=30)
    task = base.with_options({"lease_timeout": 10, "max_waits": 3}, "task t")
    assert (task.lease_timeout, task.max_waits) == (10, 3)
    assert (base.lease_timeout, base.max_waits) == (30, None)
    assert base.with_options({}, "task t") == base


@pytest.mark.parametrize("option", [*sorted(APP_WIDE), "lease_timout", "semaphore_lease_timeout"])
def test_with_options_refuses_app_wide_and_unknown_options(option: str) -> None:
    with pytest.raises(ValueError, match=rf"^task t: unknown semaphore option\(s\) {option}; "):
        SemaphoreConfig().with_options({option: 1}, "task t")


def test_with_options_names_the_task_in_value_errors() -> None:
    with pytest.raises(ValueError, match=r"^task t: max_block must be a number of seconds >= 0"):
        SemaphoreConfig().with_options({"max_block": -1}, "task t")
    with pytest.raises(TypeError, match=r"^task t: backoff_jitter must be True or False"):
        SemaphoreConfig().with_options({"backoff_jitter": None}, "task t")


def test_a_task_lease_shorter_than_the_app_heartbeat_is_refused() -> None:
    app_wide = SemaphoreConfig(lease_timeout=60, heartbeat_interval=20)
    with pytest.raises(
        ValueError,
        match=r"^task t: heartbeat_interval \(20s\) must be shorter than lease_timeout \(10s\)",
    ):
        app_wide.with_options({"lease_timeout": 10}, "task t")


def test_task_config_applies_the_tasks_options_once(make_app: MakeApp) -> None:
    app = make_app(
        semaphore_lease_timeout=30, semaphore_max_waits=5, semaphore_redis_url="redis://r/0"
    )
    app.finalize()  # so that the decorator returns the task, not a proxy

    @app.task(base=LimitedTask, semaphore="s", limit=2, semaphore_max_waits=2, shared=False)
    def limited() -> None: ...

    config = task_config(limited)
    assert (config.lease_timeout, config.max_waits) == (30, 2)
    assert task_config(limited) is config
    assert get_config(app).max_waits == 5


def test_task_config_checks_the_tasks_backoff_against_the_broker(make_app: MakeApp) -> None:
    app = make_app(
        broker_url="redis://b",
        broker_transport_options={"visibility_timeout": 100},
        semaphore_backoff_max=10,
    )
    app.finalize()

    @app.task(base=LimitedTask, semaphore="s", limit=2, semaphore_backoff_max=49.5, shared=False)
    def limited() -> None: ...

    with pytest.raises(ValueError) as info:
        task_config(limited)
    assert str(info.value).startswith(
        f"task {limited.name}: semaphore_backoff_max (49.5s) plus semaphore_max_block (1s)"
    )


def test_a_missing_redis_url_is_named_as_the_app_spells_its_settings() -> None:
    """A Django project sets CELERY_SEMAPHORE_REDIS_URL, not semaphore_redis_url."""
    plain = Celery("plain", broker="amqp://guest@localhost//", set_as_current=False)
    with pytest.raises(ValueError, match=r"^Celery setting semaphore_redis_url is not set"):
        check_shared_redis(plain)
    django = Celery("django", set_as_current=False)
    django.config_from_object({"CELERY_BROKER_URL": "amqp://guest@localhost//"}, namespace="CELERY")
    with pytest.raises(
        ValueError, match=r"Set CELERY_SEMAPHORE_URL \(or CELERY_SEMAPHORE_REDIS_URL\) to the store"
    ):
        check_shared_redis(django)
    django.config_from_object(
        {"CELERY_BROKER_URL": "amqp://", "CELERY_SEMAPHORE_REDIS_URL": "redis://r:6379/0"},
        namespace="CELERY",
    )
    check_shared_redis(django)  # set: no error


@pytest.mark.parametrize(("max_block", "window"), [(1.0, 0.1), (0.05, 0.05), (0.0, 0.0)])
def test_parked_tasks_are_handed_over_at_most_a_tenth_of_a_second_ahead(
    max_block: float, window: float
) -> None:
    assert SemaphoreConfig(max_block=max_block).handover_window == window


def test_a_place_at_publish_is_near_within_the_handover_window_shadow_limits_or_not() -> None:
    from celery_semaphore.core.rates import parse_rate
    from celery_semaphore.formats import Gate
    from celery_semaphore.publish import window_of

    config = SemaphoreConfig(max_block=1.0)
    assert window_of(Gate("plain", 5), config) == 0.1
    assert window_of(Gate("shadowed", 5, shadow=frozenset({"limit"})), config) == 0.1
    slow = parse_rate("1/s", "rate")  # its own lead: 3 intervals, at most the window
    assert window_of(Gate("paced", 5, rate=slow), config) == 0.1
    assert window_of(Gate("paced", 5, rate=slow, shadow=frozenset({"rate"})), config) == 0.1


@pytest.mark.parametrize("options", [{}, {"countdown": 5}])
@pytest.mark.parametrize("wait_mode", ["handover", "countdown"])
def test_a_publisher_without_a_redis_to_share_refuses_a_limited_tasks_first_publish(
    make_app: MakeApp, wait_mode: str, options: dict[str, Any]
) -> None:
    """As the worker refuses to start (same rule, same message), before anything is
    sent or written: it used to take its places in line in redis://localhost:6379/0.
    A plain task of the same app is published as before."""
    app = make_app(semaphore_wait_mode=wait_mode)  # the in-memory broker: not Redis
    app.finalize()
    options = {**options, "queue": f"q-{uuid.uuid4().hex}"}

    @app.task(base=LimitedTask, semaphore="s", limit=1, shared=False)
    def limited() -> None: ...

    @app.task(shared=False)
    def plain() -> None: ...

    with pytest.raises(ValueError) as publisher:
        limited.apply_async(**options)
    with pytest.raises(ValueError) as worker:
        check_shared_redis(app)
    assert str(publisher.value) == str(worker.value)
    assert str(publisher.value).startswith(
        "Celery setting semaphore_redis_url is not set and the broker (memory://) is not a "
        "Redis URL the semaphores can share"
    )
    plain.apply_async(**options)
    with app.connection_for_write() as connection:
        queue = connection.default_channel.queue_declare(options["queue"])
    assert queue.message_count == 1  # the plain task's: the limited one was never sent
