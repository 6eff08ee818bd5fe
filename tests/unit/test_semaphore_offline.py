"""Semaphore and AsyncSemaphore before any round trip: settings are checked at
construction, bad arguments are refused before Redis is asked, and nothing they
show (repr, errors) carries a password. No server: sockets are refused here.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from celery_semaphore import AsyncSemaphore, Handover, Semaphore
from celery_semaphore.core import protocol

URL = "redis://app:secret@db:6399/0"


@pytest.fixture
def sem() -> Iterator[Semaphore]:
    semaphore = Semaphore(URL, "jobs", 2)
    yield semaphore
    semaphore.close()


def test_defaults_and_properties(sem: Semaphore) -> None:
    assert (sem.name, sem.limit, sem.lease_timeout) == ("jobs", 2, protocol.DEFAULT_LEASE_TIMEOUT)
    assert sem.keys.meta == f"{protocol.DEFAULT_NAMESPACE}:{{jobs}}:meta"
    assert repr(sem) == "Semaphore('redis://app:***@db:6399/0', name='jobs', limit=2)"


def test_a_ready_client_is_described_without_its_password() -> None:
    client = redis.Redis(host="db", port=6399, username="app", password="secret")
    semaphore = Semaphore(client, "jobs", 2, namespace="ns")
    assert semaphore.client is client
    assert "secret" not in repr(semaphore)
    assert semaphore.keys.meta == "ns:{jobs}:meta"
    client.close()


CONSTRUCTOR_CASES = [
    ({"limit": 0}, ValueError, "limit"),
    ({"limit": True}, TypeError, "limit"),
    ({"name": ""}, ValueError, "name"),
    ({"lease_timeout": math.inf}, ValueError, "lease_timeout"),
    ({"waiter_lease": 0}, ValueError, "waiter_lease"),
    ({"recheck_interval": None}, TypeError, "recheck_interval"),
    ({"idle_ttl": -1}, ValueError, "idle_ttl"),
    ({"namespace": "a}b"}, ValueError, "namespace"),
    ({"redis": "http://:secret@db"}, ValueError, "redis URL"),
    ({"redis": 6379}, TypeError, "redis"),
]


@pytest.mark.parametrize("cls", [Semaphore, AsyncSemaphore])
@pytest.mark.parametrize(("kwargs", "error", "argument"), CONSTRUCTOR_CASES)
def test_bad_settings_are_refused_at_construction(
    cls: type[Any], kwargs: dict[str, Any], error: type[Exception], argument: str
) -> None:
    arguments: dict[str, Any] = {"redis": URL, "name": "jobs", "limit": 2, **kwargs}
    with pytest.raises(error, match=f"^{argument} ") as info:
        cls(**arguments)
    assert "secret" not in str(info.value)


Case = tuple[str, tuple[Any, ...], dict[str, Any], type[Exception], str]
CALL_CASES: list[Case] = [
    ("attempt", (), {"ticket": 0}, ValueError, "ticket must be None or the positive int"),
    ("attempt", ("",), {}, ValueError, "holder must be 1 to 200"),
    ("attempt", (), {"info": 3}, TypeError, "info must be a str"),
    ("attempt", (), {"wait_lease": 0}, ValueError, "wait_lease must be"),
    ("attempt", (), {"lease_timeout": -1}, ValueError, "lease_timeout must be"),
    ("try_acquire", (), {"ticket": -2}, ValueError, "ticket must be"),
    ("acquire", (), {"timeout": -1}, ValueError, "timeout must be a number of seconds >= 0"),
    ("acquire", (), {"timeout": "5"}, TypeError, "timeout must be a number of seconds"),
    ("acquire", (), {"holder": 5}, TypeError, "holder must be a str"),
    ("acquire", (), {"ticket": True}, ValueError, "ticket must be"),
    ("wait_for_turn", (-1, "h"), {}, ValueError, "timeout must be"),
    ("take_place", ("h",), {"wait_lease": math.nan}, ValueError, "wait_lease must be"),
    ("take_place", ("h",), {"info": None}, TypeError, "info must be a str"),
    ("release", ("",), {}, ValueError, "holder must be"),
    ("renew_many", (["a", ""],), {}, ValueError, "holder must be"),
    ("renew_many", (["a"],), {"lease_timeout": 0}, ValueError, "lease_timeout must be"),
    ("set_limit", (0,), {}, ValueError, "limit must be an int from 1"),
    ("set_limit", ("3",), {}, TypeError, "limit must be an int from 1"),
    ("claim", ("", Handover("h", 7, "q")), {}, ValueError, "taken must be 1 to 200"),
    ("claim", (None, Handover("h", 7, "q")), {}, TypeError, "taken must be a str"),
    ("claim", ("x", ("h", 7)), {}, TypeError, "handover must be the Handover on_handover"),
    ("claim", ("x", Handover("", 7, "q")), {}, ValueError, "handover.holder must be 1 to 200"),
    ("claim", ("x", Handover("h", 0, "q")), {}, ValueError, "handover.token must be a positive"),
    ("claim", ("x", Handover("h", True, "q")), {}, ValueError, "handover.token must be"),
    ("claim", ("x", Handover("h", "7", "q")), {}, ValueError, "handover.token must be"),  # type: ignore[arg-type]
]
CALL_IDS = [f"{c[0]}-{i}" for i, c in enumerate(CALL_CASES)]


@pytest.mark.parametrize("case", CALL_CASES, ids=CALL_IDS)
def test_bad_arguments_are_refused_before_redis_is_asked(sem: Semaphore, case: Case) -> None:
    method, args, kwargs, error, words = case
    # A round trip would hit the conftest's socket guard (an AssertionError) instead.
    with pytest.raises(error, match=words):
        getattr(sem, method)(*args, **kwargs)


@pytest.mark.parametrize("case", CALL_CASES, ids=CALL_IDS)
def test_async_bad_arguments_are_refused_before_redis_is_asked(case: Case) -> None:
    method, args, kwargs, error, words = case

    async def main() -> None:
        semaphore = AsyncSemaphore(URL, "jobs", 2)
        try:
            call: Callable[..., Awaitable[Any]] = getattr(semaphore, method)
            with pytest.raises(error, match=words):
                await call(*args, **kwargs)
        finally:
            await semaphore.aclose()

    asyncio.run(main())


def test_renewing_nothing_asks_nothing(sem: Semaphore) -> None:
    assert sem.renew_many([]) == set()


def test_async_repr_masks_the_password() -> None:
    async def main() -> str:
        semaphore = AsyncSemaphore(URL, "jobs", 2)
        await semaphore.aclose()
        return repr(semaphore)

    assert (
        asyncio.run(main()) == "AsyncSemaphore('redis://app:***@db:6399/0', name='jobs', limit=2)"
    )


def test_take_place_is_the_one_way_to_take_a_place_without_asking() -> None:
    # enqueue() returned take_place()'s ticket only: two names for one operation.
    for cls in (Semaphore, AsyncSemaphore):
        assert callable(cls.take_place)
        assert not hasattr(cls, "enqueue")


def test_a_client_is_shown_as_the_url_it_was_made_from_given_at_construction() -> None:
    client = redis.Redis.from_url(URL)
    semaphore = Semaphore(client, "jobs", 2, url=URL)
    assert semaphore.url == "redis://app:***@db:6399/0"
    assert repr(semaphore) == "Semaphore('redis://app:***@db:6399/0', name='jobs', limit=2)"
    with pytest.raises(AttributeError):
        semaphore.url = "redis://elsewhere/0"  # type: ignore[misc]
    with pytest.raises(TypeError, match="url= names the URL a client"):
        Semaphore(URL, "jobs", 2, url=URL)


def test_async_a_client_is_shown_as_the_url_it_was_made_from() -> None:
    async def main() -> str:
        client = redis.asyncio.Redis.from_url(URL)
        semaphore = AsyncSemaphore(client, "jobs", 2, url=URL)
        await client.aclose()
        return repr(semaphore)

    assert (
        asyncio.run(main()) == "AsyncSemaphore('redis://app:***@db:6399/0', name='jobs', limit=2)"
    )


def test_the_sync_semaphore_refuses_an_on_handover_it_cannot_await() -> None:
    async def publish(handovers: list[Any]) -> None:
        pass

    class Publisher:
        async def __call__(self, handovers: list[Any]) -> None:
            pass

    for on_handover in (publish, Publisher()):
        with pytest.raises(TypeError, match="Semaphore cannot await it"):
            Semaphore(URL, "jobs", 2, on_handover=on_handover)
        AsyncSemaphore(URL, "jobs", 2, on_handover=on_handover)  # awaits it
