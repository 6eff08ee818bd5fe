"""Argument checks at the public edge: the right exception type, a message naming
the argument and what is accepted, and the accepted value handed back."""

from __future__ import annotations

import math
from typing import Any

import pytest
from redis.crc import key_slot

from celery_semaphore.core import validation
from celery_semaphore.core.redis.keys import name_from_meta_key, semaphore_keys
from celery_semaphore.core.validation import MAX_LIMIT, MAX_NAME_LENGTH, MAX_SECONDS


@pytest.mark.parametrize("name", ["a", "x" * MAX_NAME_LENGTH, "with space", "ünïcødé", "a{b}"])
def test_good_names_are_returned(name: str) -> None:
    assert validation.check_name(name) == name


@pytest.mark.parametrize(
    ("name", "error", "words"),
    [
        ("", ValueError, "1 to 200 characters long, got 0"),
        ("x" * (MAX_NAME_LENGTH + 1), ValueError, "got 201"),
        (None, TypeError, "must be a str, got NoneType"),
        (b"bytes", TypeError, "must be a str, got bytes"),
        (5, TypeError, "got int"),
    ],
)
def test_bad_names_say_what_is_accepted(name: Any, error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=r"^queue name ") as info:
        validation.check_name(name, "queue name")
    assert words in str(info.value)


@pytest.mark.parametrize("namespace", ["{app", "app}", "a{}", "a{b}{c}", "a{b{c}}", "}a{"])
def test_namespace_takes_braces_only_as_one_hash_tag_and_says_why(namespace: str) -> None:
    with pytest.raises(ValueError, match=r"namespace may contain braces only as one") as info:
        validation.check_namespace(namespace)
    assert "hash tag" in str(info.value) and repr(namespace) in str(info.value)


def test_a_namespace_with_a_hash_tag_puts_every_semaphore_on_one_slot() -> None:
    for namespace in ("cs{limits}", "{limits}", "a{limits}b"):
        assert validation.check_namespace(namespace) == namespace
    slots = {key_slot(semaphore_keys("cs{limits}", name).meta.encode()) for name in "abcdefgh"}
    assert len(slots) == 1
    spread = {key_slot(semaphore_keys("cs", name).meta.encode()) for name in "abcdefgh"}
    assert len(spread) > 1, "without one, each semaphore has its own tag"
    keys = semaphore_keys("cs{limits}", "a", cluster=True)
    assert key_slot(keys.epoch.encode()) == key_slot(keys.meta.encode()), "its epoch too"
    assert name_from_meta_key("cs{limits}", keys.meta) == "a"


def test_namespace_is_checked_like_a_name_first() -> None:
    with pytest.raises(ValueError, match=r"^namespace must be 1 to 200"):
        validation.check_namespace("")
    with pytest.raises(TypeError, match=r"^namespace must be a str"):
        validation.check_namespace(3)
    assert validation.check_namespace("app:prod") == "app:prod"


@pytest.mark.parametrize("limit", [1, 7, MAX_LIMIT])
def test_good_limits(limit: int) -> None:
    assert validation.check_limit(limit) == limit


@pytest.mark.parametrize(
    ("limit", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (MAX_LIMIT + 1, ValueError),
        (True, TypeError),  # bool is an int to Python, never a limit
        (1.0, TypeError),
        ("3", TypeError),
        (None, TypeError),
    ],
)
def test_bad_limits(limit: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"^max_waits must be an int from 1 to 1000000, got "):
        validation.check_limit(limit, "max_waits")


@pytest.mark.parametrize(
    ("value", "expected"), [(1, 1.0), (0.25, 0.25), (MAX_SECONDS, MAX_SECONDS)]
)
def test_good_seconds_become_floats(value: float, expected: float) -> None:
    result = validation.check_seconds(value, "lease_timeout")
    assert result == expected and type(result) is float


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, ValueError),
        (-0.5, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (MAX_SECONDS + 1, ValueError),
        (True, TypeError),
        ("30", TypeError),
        (None, TypeError),
    ],
)
def test_bad_seconds(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"^lease_timeout must be a number of seconds") as info:
        validation.check_seconds(value, "lease_timeout")
    if error is ValueError:
        assert "> 0 and at most 604800" in str(info.value)


def test_zero_seconds_only_where_allowed() -> None:
    assert validation.check_seconds(0, "timeout", allow_zero=True) == 0.0
    with pytest.raises(ValueError, match=r">= 0 and at most"):
        validation.check_seconds(-1, "timeout", allow_zero=True)
    with pytest.raises(ValueError, match=r"> 0 and at most"):
        validation.check_seconds(0, "timeout")


@pytest.mark.parametrize("ticket", [None, 1, 1_700_000_000_000_000])
def test_good_tickets(ticket: int | None) -> None:
    assert validation.check_ticket(ticket) == ticket


@pytest.mark.parametrize("ticket", [0, -3, True, "12", 1.5])
def test_bad_tickets_say_where_tickets_come_from(ticket: Any) -> None:
    with pytest.raises(ValueError, match=r"^ticket must be None or the positive int a refused"):
        validation.check_ticket(ticket)


def test_holder_and_info() -> None:
    assert validation.check_holder("worker-1") == "worker-1"
    with pytest.raises(ValueError, match=r"^holder must be 1 to 200"):
        validation.check_holder("")
    assert validation.check_info("") == ""
    with pytest.raises(TypeError, match=r"^info must be a str, got dict"):
        validation.check_info({"task": "x"})
