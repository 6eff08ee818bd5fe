"""Where tasks may park (celery_semaphore/durability.py), with fake CONFIG answers:
the broker's parking queues (RabbitMQ, a Redis broker on another server), the
broker's own server, on other transports a Redis that appends every write, and the
one warning otherwise (the retired opt-in changes nothing); with the semaphores in
PostgreSQL, the broker's parking queues where there are any, else PostgreSQL itself,
whatever it says of its WAL. The same against real servers:
tests/celery_integration/test_parking_safety.py."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery

from celery_semaphore.config import SemaphoreConfig, get_config
from celery_semaphore.core.redis.server import read_persistence
from celery_semaphore.core.results import Persistence
from celery_semaphore.durability import (
    RECHECK_EVERY,
    ParkingSafety,
    Where,
    is_the_brokers_server,
    server_of,
)

MakeApp = Callable[..., Celery]
SEMAPHORES = "redis://semaphores.internal:6379/1"
# Stands for SQS and kombu's other transports: neither AMQP nor Redis, no network.
OTHER_BROKER = "filesystem://"
WARNING = "waiting tasks do not park in the Redis at"


class FakeRedis:
    """Answers CONFIG GET with ``answers`` in turn (the last one again and again),
    and INFO persistence with ``info`` (by default it refuses INFO too); an exception
    among them is raised. A store too: its ``persistence()`` is what the Redis store
    reads."""

    def __init__(self, *answers: Any, info: Any = None) -> None:
        self.answers = list(answers)
        self.asked = 0
        self.info_answer = redis.ResponseError("unknown command 'INFO'") if info is None else info

    def info(self, section: str) -> Any:
        assert section == "persistence"
        if isinstance(self.info_answer, Exception):
            raise self.info_answer
        return self.info_answer

    def config_get(self, pattern: str) -> Any:
        assert pattern == "appendonly"
        answer = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        if isinstance(answer, Exception):
            raise answer
        return answer

    def persistence(self) -> Any:
        """As the Redis store's ``persistence()`` reads it: through CONFIG GET."""
        return read_persistence(self, "redis://fake")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


YES, NO = {"appendonly": "yes"}, {"appendonly": "no"}


@pytest.mark.parametrize(
    ("url", "server"),
    [
        ("redis://cache.internal:6380/2", ("tcp", "cache.internal", "6380")),
        ("redis://:secret@Cache.Internal/0", ("tcp", "cache.internal", "6379")),
        ("rediss://user:pw@cache.internal:6390", ("tcp", "cache.internal", "6390")),
        ("redis://127.0.0.1:6379/0", ("tcp", "localhost", "6379")),
        ("redis://localhost", ("tcp", "localhost", "6379")),
        ("redis://[::1]:6379", ("tcp", "localhost", "6379")),
        ("unix:///run/redis/redis.sock?db=3", ("unix", "/run/redis/redis.sock")),
        ("redis+socket:///run/redis/redis.sock", ("unix", "/run/redis/redis.sock")),
        ("redis+cluster://node:7000", None),
        ("redis+sentinel://sentinel:26379/mymaster", None),
        ("sentinel://sentinel:26379", None),
        ("amqp://guest:guest@rabbit:5672//", None),
        ("redis://host:notaport/0", None),
        ("unix://", None),
    ],
)
def test_the_server_a_url_names(url: str, server: tuple[str, ...] | None) -> None:
    assert server_of(url) == server


@pytest.mark.parametrize(
    ("broker", "semaphores", "same"),
    [
        ("redis://cache.internal:6379/0", "redis://cache.internal:6379/1", True),  # another db
        ("redis://cache.internal:6379/0", "redis://:pw@cache.internal/5", True),
        ("redis://localhost:6379/0", "redis://127.0.0.1:6379/1", True),
        ("redis://cache.internal:6379/0", "redis://cache.internal:6380/0", False),
        ("redis://cache.internal:6379/0", "redis://other.internal:6379/0", False),
        ("unix:///run/redis.sock?db=0", "unix:///run/redis.sock?db=1", True),
        ("redis+socket:///run/redis.sock", "unix:///run/redis.sock", True),
        ("unix:///run/redis.sock", "unix:///run/other.sock", False),
        ("unix:///run/redis.sock", "redis://localhost:6379/0", False),
        ("redis://a:6379/0;redis://a:6379/1", "redis://a:6379/2", True),
        ("redis://a:6379/0;redis://b:6379/0", "redis://a:6379/2", False),  # failover elsewhere
        ("amqp://guest:guest@localhost:5672//", "redis://localhost:6379/0", False),
        ("sentinel://localhost:26379", "redis://localhost:26379/0", False),
        ("redis://a:7000/0", "redis+cluster://a:7000", False),
    ],
)
def test_the_brokers_server_is_recognised_by_address_whatever_the_database(
    make_app: MakeApp, broker: str, semaphores: str, same: bool
) -> None:
    assert is_the_brokers_server(make_app(broker_url=broker), semaphores) is same


def test_a_broker_read_or_write_url_elsewhere_is_not_the_same_server(make_app: MakeApp) -> None:
    app = make_app(broker_url="redis://a:6379/0", broker_read_url="redis://b:6379/0")
    assert not is_the_brokers_server(app, "redis://a:6379/1")
    app = make_app(broker_url="redis://a:6379/0", broker_write_url="redis://a:6379/3")
    assert is_the_brokers_server(app, "redis://a:6379/1")


@pytest.mark.parametrize(
    ("reply", "every_write"),
    [
        (YES, True),
        (NO, False),
        ({"appendonly": "YES"}, True),
        ({b"appendonly": b"yes"}, True),
        ({"n1:7000": YES, "n2:7001": YES}, True),  # a Cluster: one reply per primary
        ({"n1:7000": YES, "n2:7001": NO}, False),
        ({}, None),
        ({"n1:7000": YES, "n2:7001": {}}, None),
    ],
)
def test_what_config_get_appendonly_says(reply: Any, every_write: bool | None) -> None:
    assert read_persistence(FakeRedis(reply)).every_write is every_write


REFUSED = redis.ResponseError("unknown command 'CONFIG', with args beginning with: 'GET'")


@pytest.mark.parametrize(
    ("info", "every_write"),
    [
        ({"aof_enabled": 1, "rdb_changes_since_last_save": 0}, True),
        ({"aof_enabled": 0}, False),
        ({"n1:7000": {"aof_enabled": 1}, "n2:7001": {"aof_enabled": 1}}, True),  # a Cluster
        ({"n1:7000": {"aof_enabled": 1}, "n2:7001": {"aof_enabled": 0}}, False),
        ({"loading": 0}, None),
        (redis.exceptions.NoPermissionError("no permissions to run 'info'"), None),
    ],
)
def test_a_redis_that_refuses_config_is_read_through_info_persistence(
    info: Any, every_write: bool | None
) -> None:
    """Managed services that refuse CONFIG answer INFO: ``aof_enabled`` says it."""
    persistence = read_persistence(FakeRedis(REFUSED, info=info))
    assert persistence.every_write is every_write
    if every_write is not None:
        assert persistence.detail.endswith("(read by INFO persistence: CONFIG GET refused)")
    elif isinstance(info, Exception):
        assert str(REFUSED) in persistence.detail and str(info) in persistence.detail


def safety_and_app(
    make_app: MakeApp, broker: str = OTHER_BROKER, **conf: Any
) -> tuple[ParkingSafety, Celery, Clock]:
    clock = Clock()
    return ParkingSafety(clock=clock), make_app(broker_url=broker, **conf), clock


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "celery_semaphore.durability"]


def test_a_redis_that_appends_every_write_takes_parked_tasks(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    safety, app, _ = safety_and_app(make_app)
    assert safety.where(app, SemaphoreConfig(redis_url=SEMAPHORES), FakeRedis(YES)) is Where.STORE
    assert warnings_of(caplog) == []


def test_a_redis_that_persists_nothing_takes_none_and_says_so_once(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    safety, app, clock = safety_and_app(make_app)
    config = SemaphoreConfig(redis_url="redis://:secret@semaphores.internal:6379/1")
    client = FakeRedis(NO)
    for _ in range(5):
        assert safety.where(app, config, client) is None
        clock.now += RECHECK_EVERY  # read again each time: still one warning
    assert client.asked == 5
    (warning,) = warnings_of(caplog)
    assert caplog.records[-1].levelno == logging.WARNING
    assert "the Redis at redis://:***@semaphores.internal:6379/1" in warning
    assert "secret" not in warning
    assert "not the broker's server" in warning
    assert "appendonly no" in warning
    assert "countdown retries instead, their messages in the broker" in warning
    assert "Set appendonly yes on that Redis to let tasks park there" in warning
    assert "semaphore_park_without_persistence" not in warning


@pytest.mark.parametrize(
    "refusal",
    [
        redis.ResponseError("unknown command 'CONFIG', with args beginning with: 'GET'"),
        redis.exceptions.NoPermissionError("this user has no permissions to run 'config|get'"),
    ],
)
def test_a_redis_that_refuses_config_takes_none_and_says_to_let_the_check_see_it(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture, refusal: Exception
) -> None:
    safety, app, _ = safety_and_app(make_app)
    client = FakeRedis(refusal)
    config = SemaphoreConfig(redis_url=SEMAPHORES)
    assert safety.where(app, config, client) is None
    assert safety.where(app, config, client) is None
    assert client.asked == 1  # the refusal is an answer, kept for a while
    (warning,) = warnings_of(caplog)
    assert "whether it persists is unknown" in warning
    assert str(refusal) in warning
    assert (
        "Set appendonly yes on that Redis and let this Redis user run CONFIG GET or INFO" in warning
    )
    assert "semaphore_park_without_persistence" not in warning


def test_an_unreachable_redis_takes_none_says_nothing_and_is_asked_again(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    safety, app, _ = safety_and_app(make_app)
    client = FakeRedis(redis.ConnectionError("refused"), redis.TimeoutError("slow"), YES)
    config = SemaphoreConfig(redis_url=SEMAPHORES)
    assert safety.where(app, config, client) is None
    assert safety.where(app, config, client) is None
    assert safety.where(app, config, client) is Where.STORE
    assert client.asked == 3
    assert warnings_of(caplog) == []


def test_the_reading_is_kept_a_minute_then_read_again(make_app: MakeApp) -> None:
    safety, app, clock = safety_and_app(make_app)
    client = FakeRedis(NO, YES)
    config = SemaphoreConfig(redis_url=SEMAPHORES)
    assert safety.where(app, config, client) is None
    clock.now += RECHECK_EVERY - 1
    assert safety.where(app, config, client) is None
    assert client.asked == 1
    clock.now += 1
    assert safety.where(app, config, client) is Where.STORE  # appendonly turned on meanwhile
    assert client.asked == 2


def test_the_brokers_own_server_takes_parked_tasks_without_asking(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    safety, app, _ = safety_and_app(make_app, "redis://broker.internal/0")
    client = FakeRedis(NO)
    assert (
        safety.where(app, SemaphoreConfig(redis_url="redis://broker.internal/1"), client)
        is Where.STORE
    )
    assert client.asked == 0
    assert warnings_of(caplog) == []


def test_whether_it_is_the_brokers_server_is_kept_a_minute_then_read_again(
    make_app: MakeApp,
) -> None:
    safety, app, clock = safety_and_app(make_app, "redis://broker.internal/0")
    client = FakeRedis(NO)
    config = SemaphoreConfig(redis_url="redis://broker.internal/1")
    assert safety.where(app, config, client) is Where.STORE
    app.conf.broker_url = "redis://elsewhere.internal/0"  # settings read once a minute
    clock.now += RECHECK_EVERY - 1
    assert safety.where(app, config, client) is Where.STORE
    clock.now += 1
    assert safety.where(app, config, client) is Where.BROKER  # a Redis broker elsewhere
    assert client.asked == 0  # what the Redis keeps does not matter


def test_on_a_redis_broker_elsewhere_tasks_park_in_the_broker_whatever_the_redis_keeps(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    safety, app, _ = safety_and_app(make_app, "redis://broker.internal/0")
    client = FakeRedis(NO)
    assert safety.where(app, SemaphoreConfig(redis_url=SEMAPHORES), client) is Where.BROKER
    assert client.asked == 0
    assert warnings_of(caplog) == []


@pytest.mark.parametrize("value", [True, False, "yes"])
def test_the_retired_opt_in_parks_nowhere_it_would_not_park_otherwise(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture, value: Any
) -> None:
    """semaphore_park_without_persistence is ignored: a Redis that persists nothing
    takes no parked task, and the warning does not suggest the setting."""
    safety, app, _ = safety_and_app(
        make_app, semaphore_redis_url=SEMAPHORES, semaphore_park_without_persistence=value
    )
    config = get_config(app)
    assert config.park_without_persistence is None
    assert safety.where(app, config, FakeRedis(NO)) is None
    (warning,) = warnings_of(caplog)
    assert "appendonly no" in warning
    assert "semaphore_park_without_persistence" not in warning


@pytest.mark.parametrize(
    "error",
    [redis.ConnectionError("down"), redis.exceptions.RedisClusterException("no node")],
    ids=["connection", "cluster"],
)
def test_a_redis_that_cannot_answer_is_a_connection_error_for_the_worker(error: Exception) -> None:
    """The worker's check at start (bootstep.check_reachable) catches the package's
    errors only: every way of not answering becomes SemaphoreConnectionError,
    a Cluster's own exceptions (no RedisError) too."""
    from celery_semaphore.core.errors import SemaphoreConnectionError
    from celery_semaphore.core.redis.server import ping

    class Unreachable:
        def ping(self) -> None:
            raise error

    with pytest.raises(SemaphoreConnectionError):
        ping(Unreachable(), "redis://semaphores.internal:6379/1")


def test_on_an_amqp_broker_tasks_park_in_the_broker_whatever_the_redis_keeps(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    safety = ParkingSafety()
    app = make_app(broker_url="amqp://guest:guest@rabbit.internal:5672//")
    client = FakeRedis(NO)
    assert safety.where(app, SemaphoreConfig(redis_url=SEMAPHORES), client) is Where.BROKER
    assert client.asked == 0  # what the Redis keeps does not matter
    assert warnings_of(caplog) == []
    assert safety.broker_is_amqp(app)
    assert not ParkingSafety().broker_is_amqp(make_app(broker_url="redis://broker.internal/0"))


class FakePostgres:
    """A PostgreSQL store as `ParkingSafety.where` sees it: its ``persistence()`` (a
    test cluster's: fsync off) counted, never to be asked."""

    def __init__(self) -> None:
        self.asked = 0

    def persistence(self) -> Persistence:
        self.asked += 1
        return Persistence(False, "fsync off, synchronous_commit off")


# On the port a Redis broker of the same host might use: PostgreSQL is never that server.
POSTGRES = "postgresql://app:s3cret@db.internal:6379/jobs"


@pytest.mark.parametrize(
    "broker",
    ["amqp://guest:guest@rabbit.internal:5672//", "redis://db.internal:6379/0"],
    ids=["amqp", "redis"],
)
def test_with_postgresql_tasks_park_in_the_brokers_parking_queues_where_it_has_them(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture, broker: str
) -> None:
    safety, app, _ = safety_and_app(make_app, broker)
    store = FakePostgres()
    config = SemaphoreConfig(redis_url=POSTGRES)
    assert safety.in_broker(app, config)
    assert safety.where(app, config, store) is Where.BROKER
    assert store.asked == 0
    assert warnings_of(caplog) == []


def test_with_postgresql_on_another_broker_tasks_park_in_postgresql_without_asking(
    make_app: MakeApp, caplog: pytest.LogCaptureFixture
) -> None:
    """A parked message in PostgreSQL is as safe as its WAL: parking is always allowed
    there, even where the server says fsync is off, and nothing is warned about."""
    safety, app, clock = safety_and_app(make_app)
    store = FakePostgres()
    config = SemaphoreConfig(redis_url=POSTGRES)
    assert not safety.in_broker(app, config)
    for _ in range(3):
        assert safety.where(app, config, store) is Where.STORE
        clock.now += RECHECK_EVERY
    assert store.asked == 0
    assert warnings_of(caplog) == []


def test_where_a_task_parks_in_an_operators_words() -> None:
    assert Where.STORE.in_words("PostgreSQL") == "in the semaphores' PostgreSQL"
    assert Where.STORE.in_words("Redis") == "in the semaphores' Redis"
    assert Where.BROKER.in_words("Redis") == "in a parking queue of the broker"
