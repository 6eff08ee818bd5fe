"""Every error of the package survives the result backend: ``type(e)(*e.args)``."""

from __future__ import annotations

import pickle

import pytest

from celery_semaphore import (
    SemaphoreBackendError,
    SemaphoreConnectionError,
    SemaphoreError,
    SemaphoreKeyTypeError,
    SemaphoreTimeout,
    StaleHandover,
    UnknownSemaphore,
    WaitingForPermit,
)

ERRORS = [
    SemaphoreTimeout("s", 3, 1.25, "position 4 in line"),
    SemaphoreConnectionError("redis://h:1/0", "refused"),
    SemaphoreBackendError("denied"),
    SemaphoreKeyTypeError("k", "string", "zset"),
    UnknownSemaphore("s", "ns"),
    StaleHandover("s", 7),
    WaitingForPermit("s", 4, 2),
    WaitingForPermit("s", 4, 2, "rate"),
    WaitingForPermit("s", 1, 1, "paused"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_rebuilt_from_args_and_pickled_it_says_the_same(error: SemaphoreError) -> None:
    assert isinstance(error, SemaphoreError)
    rebuilt = type(error)(*error.args)
    assert str(rebuilt) == str(error)
    assert str(pickle.loads(pickle.dumps(error))) == str(error)
    assert repr(error) == f"{type(error).__name__}({str(error)!r})"  # as Flower shows it


def test_messages_say_what_to_do() -> None:
    assert "check the name and semaphore_namespace" in str(UnknownSemaphore("x", "ns"))
    assert "drop it" in str(StaleHandover("x", 1))
    assert "another program writes to this key" in str(SemaphoreKeyTypeError("k", "a", "b"))
    assert isinstance(SemaphoreTimeout("s", 1, 0.0), TimeoutError)
    assert isinstance(SemaphoreConnectionError("u", "x"), ConnectionError)
    assert isinstance(UnknownSemaphore("s", "ns"), LookupError)


def test_a_wait_names_the_semaphore_and_the_place() -> None:
    assert str(WaitingForPermit("partner-api", 7, 3)) == (
        "waiting for a permit of semaphore 'partner-api': place 7 in line (wait 3)"
    )
    assert "no place in line yet" in str(WaitingForPermit("p", 0, 1))


def test_a_wait_for_a_rate_says_so() -> None:
    assert str(WaitingForPermit("partner-api", 3, 1, "rate")) == (
        "waiting for a permit of semaphore 'partner-api': place 3 in line, for its rate's "
        "slot (wait 1)"
    )
    assert "its rate paused (RateLimited)" in str(WaitingForPermit("p", 1, 2, "paused"))
