"""The idle pub/sub objects kept between waits in place (core/listeners.py)."""

from __future__ import annotations

import os

import pytest

from celery_semaphore.core.redis import listeners
from celery_semaphore.core.redis.listeners import KEEP, IdleListeners


class Client:
    """Stands for a redis client: hashable, weakly referable."""


def test_kept_per_client_at_most_keep_each() -> None:
    idle, one, two = IdleListeners(), Client(), Client()
    assert [idle.give(one, f"p{i}") for i in range(KEEP + 1)] == [True] * KEEP + [False]
    assert idle.give(two, "q") is True
    assert idle.take(two) == "q"
    assert idle.take(two) is None
    assert sorted(idle.take(one) for _ in range(KEEP)) == [f"p{i}" for i in range(KEEP)]
    assert idle.take(one) is None


def test_a_forked_process_does_not_take_its_parents(monkeypatch: pytest.MonkeyPatch) -> None:
    idle, client = IdleListeners(), Client()
    idle.give(client, "parent's")
    child = os.getpid() + 1
    monkeypatch.setattr(listeners.os, "getpid", lambda: child)
    assert idle.take(client) is None
    idle.give(client, "child's")
    assert idle.take(client) == "child's"


def test_a_client_nobody_uses_is_not_kept_alive() -> None:
    idle, client = IdleListeners(), Client()
    idle.give(client, "p")
    del client
    assert len(idle._idle) == 0
