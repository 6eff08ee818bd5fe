"""What the plugin keeps per app (``app.semaphore_state``): made once, shared by
every caller, dropped (and its clients closed) by ``reset``. No client here
ever connects: building one from a URL does not."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery

import celery_semaphore
from celery_semaphore.config import SemaphoreConfig, get_config
from celery_semaphore.core import Semaphore
from celery_semaphore.core.redis.scripts import NAMES, PARKED_INDEX_NAMES
from celery_semaphore.state import (
    QUICK_TIMEOUT,
    AppState,
    Semaphores,
    SharedFlag,
    reset,
    state_of,
)

MakeApp = Callable[..., Celery]
CONFIG = SemaphoreConfig(redis_url="redis://:secret@db:6390/0", namespace="ns", lease_timeout=20)


def test_state_is_made_once_per_app_and_kept_on_it(make_app: MakeApp) -> None:
    first, second = make_app(), make_app()
    state = state_of(first)
    assert isinstance(state, AppState)
    assert state_of(first) is state
    assert first.semaphore_state is state  # type: ignore[attr-defined]
    assert state_of(second) is not state


def test_reset_forgets_settings_and_closes_clients(
    make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app(semaphore_lease_timeout=30)
    assert get_config(app).lease_timeout == 30
    semaphore = state_of(app).semaphores.get("s", 2, CONFIG)
    closed: list[bool] = []
    monkeypatch.setattr(semaphore.client, "close", lambda: closed.append(True))
    state_of(app).publish_paused_until = 1e12

    app.conf.semaphore_lease_timeout = 10
    celery_semaphore.reset(app)
    assert closed == [True]
    assert "semaphore_state" not in app.__dict__
    assert get_config(app).lease_timeout == 10
    fresh = state_of(app)
    assert fresh.publish_paused_until == 0.0
    assert fresh.semaphores.get("s", 2, CONFIG) is not semaphore


def test_reset_of_an_app_never_used_is_harmless(make_app: MakeApp) -> None:
    app = make_app()
    reset(app)
    reset(app)
    assert "semaphore_state" not in app.__dict__


def test_one_semaphore_per_gate_and_settings_one_client_per_url(make_app: MakeApp) -> None:
    semaphores = state_of(make_app()).semaphores
    first = semaphores.get("s", 2, CONFIG)
    assert semaphores.get("s", 2, CONFIG) is first
    assert (first.name, first.limit, first.lease_timeout) == ("s", 2, 20.0)
    assert first.keys.meta == "ns:{s}:meta"
    # Another limit or lease (a task's own options): another semaphore, the same client.
    other_limit = semaphores.get("s", 3, CONFIG)
    longer = semaphores.get("s", 2, CONFIG.with_options({"lease_timeout": 90}, "task t"))
    assert len({id(first), id(other_limit), id(longer)}) == 3
    assert first.client is other_limit.client is longer.client
    other_url = semaphores.get("s", 2, SemaphoreConfig(redis_url="redis://elsewhere/0"))
    assert other_url.client is not first.client


def test_the_semaphores_url_is_masked(make_app: MakeApp) -> None:
    semaphore = state_of(make_app()).semaphores.get("s", 2, CONFIG)
    assert semaphore.url == "redis://:***@db:6390/0"
    assert "secret" not in repr(semaphore)


def test_quick_semaphores_give_up_fast(make_app: MakeApp) -> None:
    semaphores = state_of(make_app()).semaphores
    normal = semaphores.get("s", 2, CONFIG)
    quick = semaphores.get("s", 2, CONFIG, quick=True)
    assert quick is not normal and quick.client is not normal.client
    assert semaphores.get("s", 2, CONFIG, quick=True) is quick
    kwargs = quick.client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == QUICK_TIMEOUT
    assert (kwargs["host"], kwargs["password"]) == ("db", "secret")  # the same Redis
    assert normal.client.connection_pool.connection_kwargs.get("socket_timeout") != QUICK_TIMEOUT


def test_many_keys_keep_the_cache_at_its_bound_dropping_the_least_recently_used(
    make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key function makes a semaphore per key: a worker that saw a million
    customers must not keep a million semaphores."""
    monkeypatch.setattr(Semaphores, "MOST_SEMAPHORES", 4)
    semaphores = state_of(make_app()).semaphores
    first = {f"customer-{i}": semaphores.get(f"customer-{i}", 2, CONFIG) for i in range(4)}
    assert semaphores.get("customer-0", 2, CONFIG) is first["customer-0"]  # used again
    for i in range(4, 100):
        semaphores.get(f"customer-{i}", 2, CONFIG)
        semaphores.get("customer-0", 2, CONFIG)
        assert len(semaphores._semaphores) <= 4
    assert semaphores.get("customer-0", 2, CONFIG) is first["customer-0"]
    assert semaphores.get("customer-99", 2, CONFIG).name == "customer-99"
    again = semaphores.get("customer-1", 2, CONFIG)  # dropped: made again, same client
    assert again is not first["customer-1"] and again.client is first["customer-1"].client


def test_the_scripts_are_registered_once_per_client(
    make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    registered: list[Any] = []
    register = redis.Redis.register_script

    def counting(self: Any, script: Any) -> Any:
        registered.append(script)
        return register(self, script)

    monkeypatch.setattr(redis.Redis, "register_script", counting)
    semaphores = state_of(make_app()).semaphores
    for i in range(50):
        semaphores.get(f"customer-{i}", 2, CONFIG)
    per_client = len(NAMES) + len(PARKED_INDEX_NAMES)
    assert len(registered) == per_client == 14
    semaphores.get("s", 2, SemaphoreConfig(redis_url="redis://elsewhere/0"))  # another client
    assert len(registered) == 2 * per_client


def test_the_scripts_of_a_client_do_not_keep_it_alive() -> None:
    client = redis.Redis(host="db")
    semaphore = Semaphore(client, "s", 1)
    gone = weakref.ref(client)
    del client, semaphore
    gc.collect()
    assert gone() is None


def test_no_lua_file_is_read_after_import() -> None:
    """A pool child forked while the heartbeat thread read a script (under an import
    lock of importlib.resources) hung at its own first read: they are read at import."""
    code = (
        "import importlib.resources, redis\n"
        "from celery_semaphore.core.redis import scripts\n"
        "def refuse(*args, **kwargs): raise AssertionError('a Lua file read after import')\n"
        "importlib.resources.files = scripts.files = refuse\n"
        "assert len(scripts.registered(redis.Redis())) == len(scripts.SOURCES)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_shared_flag_set_in_a_child_is_seen_by_its_parent_and_siblings() -> None:
    """The worker makes the flag before it forks its pool: what one pool process
    learns (Redis answered), the worker and the other pool processes know."""
    flag = SharedFlag()
    assert not flag
    sibling_read, sibling_write = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns of fork() in a process with threads: these children only
        # read or write the flag and exit.
        warnings.simplefilter("ignore", DeprecationWarning)
        sibling = os.fork()
        if sibling == 0:  # waits for the setter, then says what it sees
            os.read(sibling_read, 1)
            os._exit(0 if flag else 1)
        setter = os.fork()
        if setter == 0:
            flag.set()
            os._exit(0)
    assert os.waitpid(setter, 0)[1] == 0
    assert flag
    os.write(sibling_write, b"x")
    assert os.waitpid(sibling, 0)[1] == 0
    os.close(sibling_read)
    os.close(sibling_write)
