"""How the semaphore fails: bad arguments, foreign data in its keys, an unreachable
Redis (without leaking passwords), and a Redis that restarts and loses its data.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from celery_semaphore import (
    Permit,
    Place,
    Semaphore,
    SemaphoreConnectionError,
    SemaphoreError,
    SemaphoreKeyTypeError,
)
from celery_semaphore.core.redis import epochs
from celery_semaphore.core.redis.keys import ROLE_TYPES, ROLES
from devkit.redis_servers import AclRedisServer, RedisServer, free_port


def granted(result: Permit | Place) -> Permit:
    assert isinstance(result, Permit), f"expected a permit, got {result!r}"
    return result


def refused(result: Permit | Place) -> Place:
    assert isinstance(result, Place), f"expected a place, got {result!r}"
    return result


# -------------------------------------------------------------------- bad input

CONSTRUCTOR_CASES = [
    # (keyword arguments, exception type, argument named in the message)
    ({"limit": 0}, ValueError, "limit"),
    ({"limit": -1}, ValueError, "limit"),
    ({"limit": True}, TypeError, "limit"),
    ({"limit": "5"}, TypeError, "limit"),
    ({"limit": 1.5}, TypeError, "limit"),
    ({"limit": None}, TypeError, "limit"),
    ({"name": ""}, ValueError, "name"),
    ({"name": "x" * 201}, ValueError, "name"),
    ({"name": 5}, TypeError, "name"),
    ({"name": None}, TypeError, "name"),
    ({"name": b"bytes"}, TypeError, "name"),
    ({"lease_timeout": 0}, ValueError, "lease_timeout"),
    ({"lease_timeout": -1}, ValueError, "lease_timeout"),
    ({"lease_timeout": math.nan}, ValueError, "lease_timeout"),
    ({"lease_timeout": math.inf}, ValueError, "lease_timeout"),
    ({"lease_timeout": "30"}, TypeError, "lease_timeout"),
    ({"lease_timeout": True}, TypeError, "lease_timeout"),
    ({"waiter_lease": 0}, ValueError, "waiter_lease"),
    ({"recheck_interval": -0.5}, ValueError, "recheck_interval"),
    ({"idle_ttl": math.nan}, ValueError, "idle_ttl"),
    ({"namespace": "my{app"}, ValueError, "namespace"),
    ({"namespace": "my}app"}, ValueError, "namespace"),
    ({"namespace": "my{a}{b}"}, ValueError, "namespace"),
    ({"namespace": ""}, ValueError, "namespace"),
    ({"namespace": 3}, TypeError, "namespace"),
    ({"redis": "http://127.0.0.1:6379/0"}, ValueError, "redis"),
    ({"redis": "127.0.0.1:6379"}, ValueError, "redis"),
    ({"redis": "redis+nonsense://127.0.0.1:6379"}, ValueError, "redis"),
    ({"redis": 6379}, TypeError, "redis"),
    ({"redis": None}, TypeError, "redis"),
    ({"rate": "0/s"}, ValueError, "rate"),
    ({"rate": "5/d"}, ValueError, "rate"),
    ({"rate": "fast"}, ValueError, "rate"),
    ({"rate": 20}, TypeError, "rate"),
    ({"rate": "2000000/s"}, ValueError, "rate"),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "argument"),
    CONSTRUCTOR_CASES,
    ids=[f"{next(iter(k))}={next(iter(k.values()))!r}"[:40] for k, _, _ in CONSTRUCTOR_CASES],
)
def test_bad_constructor_arguments_are_refused(
    redis_session_server: RedisServer, kwargs: dict[str, Any], error: type, argument: str
) -> None:
    arguments: dict[str, Any] = {"redis": redis_session_server.url, "name": "n", "limit": 1}
    arguments.update(kwargs)
    with pytest.raises(error) as info:
        Semaphore(**arguments)
    message = str(info.value)
    assert message.startswith(argument), message


def test_a_bad_url_message_does_not_show_its_password() -> None:
    with pytest.raises(ValueError, match=r"redis URL") as info:
        Semaphore("http://user:hunter2@127.0.0.1:6379/0", "n", 1)
    assert "hunter2" not in str(info.value)


@pytest.fixture
def sem(redis_session_server: RedisServer) -> Any:
    sem = Semaphore(redis_session_server.url, f"bad-{uuid.uuid4().hex}", 2)
    yield sem
    sem.close()


CALL_CASES: list[tuple[str, Callable[[Semaphore], object], type, str]] = [
    ("holder=5", lambda s: s.attempt(5), TypeError, "holder"),  # type: ignore[arg-type]
    ("holder=''", lambda s: s.attempt(""), ValueError, "holder"),
    ("holder=None-acquire", lambda s: s.acquire(holder=b"x"), TypeError, "holder"),  # type: ignore[arg-type]
    ("ticket=-1", lambda s: s.attempt("h", ticket=-1), ValueError, "ticket"),
    ("ticket=0", lambda s: s.attempt("h", ticket=0), ValueError, "ticket"),
    ("ticket='x'", lambda s: s.attempt("h", ticket="x"), ValueError, "ticket"),  # type: ignore[arg-type]
    ("ticket=True", lambda s: s.attempt("h", ticket=True), ValueError, "ticket"),
    ("ticket=1.5", lambda s: s.acquire(holder="h", ticket=1.5), ValueError, "ticket"),  # type: ignore[arg-type]
    ("lease_timeout=0", lambda s: s.attempt("h", lease_timeout=0), ValueError, "lease_timeout"),
    (
        "lease_timeout=nan",
        lambda s: s.attempt("h", lease_timeout=math.nan),
        ValueError,
        "lease_timeout",
    ),
    ("wait_lease=-1", lambda s: s.attempt("h", wait_lease=-1), ValueError, "wait_lease"),
    ("info=3", lambda s: s.attempt("h", info=3), TypeError, "info"),  # type: ignore[arg-type]
    ("timeout=-1", lambda s: s.acquire(timeout=-1), ValueError, "timeout"),
    ("timeout=nan", lambda s: s.acquire(timeout=math.nan), ValueError, "timeout"),
    ("set_limit(0)", lambda s: s.set_limit(0), ValueError, "limit"),
    ("set_limit('3')", lambda s: s.set_limit("3"), TypeError, "limit"),  # type: ignore[arg-type]
    ("release(7)", lambda s: s.release(7), TypeError, "holder"),  # type: ignore[arg-type]
    ("renew_many([7])", lambda s: s.renew_many([7]), TypeError, "holder"),  # type: ignore[list-item]
    (
        "renew lease=-1",
        lambda s: s.renew_many(["h"], lease_timeout=-1),
        ValueError,
        "lease_timeout",
    ),
]


@pytest.mark.parametrize(
    ("call", "error", "argument"),
    [case[1:] for case in CALL_CASES],
    ids=[case[0] for case in CALL_CASES],
)
def test_bad_call_arguments_are_refused_and_change_nothing(
    sem: Semaphore, call: Callable[[Semaphore], object], error: type, argument: str
) -> None:
    with pytest.raises(error) as info:
        call(sem)
    assert str(info.value).startswith(argument), str(info.value)
    status = sem.status()
    assert (status.holder_count, status.waiter_count, status.override) == (0, 0, None)


# --------------------------------------------------------------- wrong Redis type


# parked and handed are read only by parking clients: see test_parking.py.
@pytest.mark.parametrize(("role", "expected"), list(zip(ROLES[:6], ROLE_TYPES[:6], strict=True)))
def test_a_key_of_the_wrong_type_is_named_in_the_error(
    sem: Semaphore, role: str, expected: str
) -> None:
    key = getattr(sem.keys, role)
    if role in ("waiters", "wexp", "winfo"):
        # These are only read on the waiting path: fill the semaphore first.
        granted(sem.attempt("a"))
        granted(sem.attempt("b"))
    sem.client.delete(key)
    sem.client.set(key, "not mine")
    with pytest.raises(SemaphoreKeyTypeError) as info:
        sem.attempt("contender")
    assert info.value.key == key
    assert (info.value.actual, info.value.expected) == ("string", expected)
    assert key in str(info.value)
    assert isinstance(info.value, SemaphoreError)


def test_wrong_type_from_every_operation(sem: Semaphore) -> None:
    key = sem.keys.holders
    sem.client.rpush(key, "x")
    operations: list[Callable[[], object]] = [
        lambda: sem.attempt("a"),
        lambda: sem.acquire(timeout=1),
        lambda: sem.release("a"),
        lambda: sem.renew_many(["a"]),
        sem.status,
        lambda: sem.set_limit(3),
        sem.clear_limit,
        lambda: sem.set_draining(True),
    ]
    for operation in operations:
        with pytest.raises(SemaphoreKeyTypeError) as info:
            operation()
        assert (info.value.key, info.value.actual) == (key, "list")


# ------------------------------------------------------------ unreachable Redis


def test_an_unreachable_redis_raises_a_connection_error_naming_the_url() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens there
    sem = Semaphore(url, "n", 1)
    try:
        operations: list[Callable[[], object]] = [
            sem.attempt,
            lambda: sem.acquire(timeout=1),
            lambda: sem.release("h"),
            lambda: sem.renew_many(["h"]),
            sem.status,
            lambda: sem.set_limit(2),
        ]
        for operation in operations:
            started = time.monotonic()
            with pytest.raises(SemaphoreConnectionError) as info:
                operation()
            assert time.monotonic() - started < 5
            assert url in str(info.value)
            assert info.value.url == url
            assert isinstance(info.value, ConnectionError)
    finally:
        sem.close()


@pytest.mark.parametrize(
    "password",
    ["hunter2", "p%40ss%2Fw%3Ard", "pa:ss", "pass@word"],
    ids=["plain", "percent-encoded", "colon", "at-sign"],
)
def test_the_password_never_shows_in_connection_errors(password: str) -> None:
    port = free_port()
    for url in (
        f"redis://:{password}@127.0.0.1:{port}/0",
        f"redis://someone:{password}@127.0.0.1:{port}/0",
    ):
        sem = Semaphore(url, "n", 1)
        try:
            with pytest.raises(SemaphoreConnectionError) as info:
                sem.attempt()
        finally:
            sem.close()
        shown = f"{info.value} {info.value!r} {info.value.url} {sem!r} {sem.url}"
        assert "***" in str(info.value)
        assert f"127.0.0.1:{port}/0" in str(info.value)
        assert password not in shown, shown
        if "@" in password:  # no part of it either (redis-py splits at the last "@")
            assert password.rsplit("@", 1)[1] not in shown, shown


def test_a_password_in_the_query_string_is_masked_too() -> None:
    # redis-py takes ?password=... from the URL like the userinfo part.
    url = f"redis://127.0.0.1:{free_port()}/0?password=hunter2"
    sem = Semaphore(url, "n", 1)
    try:
        with pytest.raises(SemaphoreConnectionError) as info:
            sem.attempt()
    finally:
        sem.close()
    assert "hunter2" not in f"{info.value} {sem!r}"


def test_refused_credentials_raise_a_connection_error_without_the_password(
    acl_redis: AclRedisServer,
) -> None:
    sem = Semaphore(acl_redis.wrong_password_url, "n", 1)
    try:
        with pytest.raises(SemaphoreConnectionError) as info:
            sem.attempt()
    finally:
        sem.close()
    message = str(info.value)
    assert f"redis://{acl_redis.username}:***@" in message
    assert acl_redis.password not in message
    assert "credentials" in message
    # The right credentials work.
    good = Semaphore(acl_redis.url, "n", 1)
    try:
        granted(good.attempt())
    finally:
        good.close()


# ---------------------------------------------------------- Redis restarts, data lost


def test_after_a_restart_that_lost_the_data_nobody_is_admitted_until_the_holders_renewed(
    redis_server: RedisServer,
) -> None:
    sem = Semaphore(redis_server.url, "restart", 1, lease_timeout=60, pause_after_loss=1.0)
    try:
        before = granted(sem.attempt("a"))
        redis_server.restart()
        # The first call notices the loss: no grant during the pause, though the
        # holder is gone with the data.
        place = refused(sem.attempt("b"))
        assert place.resumes_in is not None and 0.5 < place.resumes_in <= 1.0
        assert place.holders == 0
        assert before.renew() is True, "a renewal during the pause writes the permit back"
        status = sem.status()
        assert [h.holder for h in status.holders] == ["a"]
        assert status.resumes_at is not None
        time.sleep(place.resumes_in + 0.05)
        refused(sem.attempt("b"))  # after the pause: still under the limit, b waits its turn
        assert sem.status().resumes_at is None
        assert before.release() is True
        after = granted(sem.attempt("b"))
        assert after.fencing_token > before.fencing_token
        assert after.release() is True
    finally:
        sem.close()


def test_after_a_data_loss_with_no_renewal_admissions_resume_when_the_pause_ends(
    redis_server: RedisServer,
) -> None:
    sem = Semaphore(redis_server.url, "nobody-renews", 1, pause_after_loss=0.5)
    try:
        before = granted(sem.attempt("a"))
        redis_server.restart()
        place = refused(sem.attempt("b"))
        assert place.resumes_in is not None
        time.sleep(place.resumes_in + 0.05)
        granted(sem.attempt("b"))
        assert before.renew() is False, "after the pause a renewal restores nothing"
    finally:
        sem.close()


def test_holders_restored_by_id_are_released_by_any_token_and_waiters_give_theirs_back(
    redis_server: RedisServer,
) -> None:
    """A worker renews by task id: it writes back its running tasks (token 0) and
    also a task that was still waiting in place, which it cannot tell apart."""
    sem = Semaphore(redis_server.url, "by-id", 1, pause_after_loss=0.6)
    try:
        holder = granted(sem.attempt("runs"))
        refused(sem.attempt("waits"))
        redis_server.restart()
        assert sem.renew_many(["runs", "waits"]) == set()  # both written back, by id
        assert sem.restored == 2
        assert {h.holder: h.fencing_token for h in sem.status().holders} == {"runs": 0, "waits": 0}
        place = refused(sem.attempt("waits"))  # it asks: it held nothing, its entry goes
        assert [h.holder for h in sem.status().holders] == ["runs"]
        assert place.resumes_in is not None
        time.sleep(place.resumes_in + 0.05)
        refused(sem.attempt("waits"))  # "runs" fills the limit
        assert holder.release() is True  # its own token releases the restored permit
        granted(sem.attempt("waits"))
    finally:
        sem.close()


def test_a_client_that_never_saw_the_data_takes_a_first_use_and_one_that_did_notices(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a process that never saw the data cannot tell (see the guarantees page),
    one that saw it notices at its next call, and pauses admissions from then."""
    seen = Semaphore(redis_server.url, "first-use", 1, pause_after_loss=5.0)
    try:
        granted(seen.attempt("a"))
        redis_server.restart()
        with monkeypatch.context() as patch:
            patch.setattr(epochs, "_known", {})  # a process that never saw the data
            fresh = Semaphore(redis_server.url, "first-use", 1)
            try:
                granted(fresh.attempt("b"))  # a first use, as far as it can tell
            finally:
                fresh.close()
        place = refused(seen.attempt("c"))
        assert place.resumes_in is not None and place.resumes_in > 4
    finally:
        seen.close()


def test_while_redis_is_down_only_connection_errors_escape(redis_server: RedisServer) -> None:
    sem = Semaphore(redis_server.url, "down", 1, lease_timeout=60)
    try:
        permit = granted(sem.attempt("a"))
        redis_server.stop()
        operations: list[Callable[[], object]] = [
            permit.renew,
            permit.release,
            sem.attempt,
            lambda: sem.acquire(timeout=1),
            sem.status,
        ]
        for operation in operations:
            with pytest.raises(SemaphoreConnectionError):
                operation()
        redis_server.start()  # same port, empty
        assert permit.renew() is True, "written back: admissions are paused after the loss"
        refused(sem.attempt("b"))
    finally:
        sem.close()


def test_a_restart_under_a_blocked_acquire_raises_nothing_unexpected(
    redis_server: RedisServer,
) -> None:
    sem = Semaphore(
        redis_server.url,
        "blocked",
        1,
        lease_timeout=60,
        recheck_interval=0.3,
        pause_after_loss=1.0,
    )
    try:
        granted(sem.attempt("holder"))
        outcome: list[object] = []

        def contend() -> None:
            try:
                outcome.append(sem.acquire(timeout=15, holder="waiter"))
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=contend, daemon=True)
        thread.start()
        deadline = time.monotonic() + 5
        while sem.status().waiter_count == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.1)
        redis_server.restart()  # the holder's permit is gone with the data, never renewed
        thread.join(15)
        assert not thread.is_alive()
        (result,) = outcome
        # The waiter's pub/sub connection sees the server go away and reconnecting
        # fails while it is down, so today acquire() gives up with a connection error
        # (the one exception allowed in that window); riding out the restart and
        # getting the permit is fine too. Anything else is a bug.
        assert isinstance(result, Permit | SemaphoreConnectionError), repr(result)
        if isinstance(result, SemaphoreConnectionError):
            result = sem.acquire(timeout=5, holder="waiter")
        assert [h.holder for h in sem.status().holders] == ["waiter"]
    finally:
        sem.close()
