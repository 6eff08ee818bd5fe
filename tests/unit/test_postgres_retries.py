"""A PostgreSQL call whose connection failed is asked again, with backoff, as redis-py's
default client asks again for the Redis store; a publisher's store (retries=0) and
errors no retry can fix (wrong credentials, a missing database) fail at once."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from celery_semaphore.core.errors import SemaphoreConnectionError
from celery_semaphore.core.operations import operated_store
from celery_semaphore.core.postgres._sync import store as postgres_store
from celery_semaphore.core.postgres._sync.store import RETRIES, PostgresStore, backoff
from celery_semaphore.core.postgres.connection import connection_error

URL = "postgresql://app@db.internal/app"


class Flaky:
    """Stands for `PostgresStore._ask`: fails ``failures`` times with ``error``."""

    def __init__(self, failures: int, error: str = "connection refused") -> None:
        self.failures, self.error, self.tries = failures, error, 0

    def __call__(self, query: str, arguments: Any) -> str:
        self.tries += 1
        if self.tries <= self.failures:
            raise connection_error(URL, psycopg.OperationalError(self.error))
        return "answer"


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(postgres_store.time, "sleep", slept.append)
    return slept


def test_the_backoff_grows_to_a_second_and_ends() -> None:
    pauses = list(backoff(RETRIES))
    assert pauses[-1] is None and len(pauses) == RETRIES + 1
    caps = [min(1.0, 0.01 * 2**n) for n in range(RETRIES)]
    assert all(0 <= p <= cap for p, cap in zip(pauses, caps, strict=False))


def test_a_call_is_asked_again_until_the_database_answers(
    monkeypatch: pytest.MonkeyPatch, pauses: list[float]
) -> None:
    store = PostgresStore(URL)
    flaky = Flaky(failures=3)
    monkeypatch.setattr(store, "_ask", flaky)
    assert store._one("SELECT 1", ()) == "answer"
    assert flaky.tries == 4 and len(pauses) == 3


def test_it_gives_up_after_the_last_retry(
    monkeypatch: pytest.MonkeyPatch, pauses: list[float]
) -> None:
    store = PostgresStore(URL)
    flaky = Flaky(failures=100)
    monkeypatch.setattr(store, "_ask", flaky)
    with pytest.raises(SemaphoreConnectionError):
        store._one("SELECT 1", ())
    assert flaky.tries == RETRIES + 1


@pytest.mark.parametrize(
    "error",
    [
        'password authentication failed for user "app"',
        'database "app" does not exist',
    ],
)
def test_what_no_retry_can_fix_fails_at_once(
    monkeypatch: pytest.MonkeyPatch, pauses: list[float], error: str
) -> None:
    store = PostgresStore(URL)
    flaky = Flaky(failures=100, error=error)
    monkeypatch.setattr(store, "_ask", flaky)
    with pytest.raises(SemaphoreConnectionError):
        store._one("SELECT 1", ())
    assert flaky.tries == 1 and pauses == []


def test_a_publishers_store_asks_once(monkeypatch: pytest.MonkeyPatch, pauses: list[float]) -> None:
    store = operated_store(URL, quick_timeout=0.25)
    assert isinstance(store, PostgresStore) and store.retries == 0
    flaky = Flaky(failures=1)
    monkeypatch.setattr(store, "_ask", flaky)
    with pytest.raises(SemaphoreConnectionError):
        store._one("SELECT 1", ())
    assert flaky.tries == 1 and pauses == []
