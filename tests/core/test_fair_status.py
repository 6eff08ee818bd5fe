"""What `status()` shows of a fair line (``fair_key=``), on a real Redis, sync and
asyncio alike: the keys waiting, most waiting first, with their grants of this minute
and the minute before, and each waiter's key; nothing of it for a line without fair
keys, and no more Redis work for it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from outcomes import granted, refused

from celery_semaphore import FairKeyInfo
from celery_semaphore.core.protocol import FAIR_TOP
from devkit.redis_servers import RedisServer

MakeSemaphore = Callable[..., Any]


def fill(sem: Any, waiting: dict[str, int]) -> None:
    """One holder, then ``waiting[key]`` waiters of each key (``<key>-<i>``) in line."""
    granted(sem.attempt("holder"))
    for key, count in waiting.items():
        for i in range(count):
            refused(sem.attempt(f"{key}-{i}", fair_key=key, wait_lease=60))


def test_status_lists_the_keys_waiting_and_each_waiters_key(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(1, fair_weights={"big": 2})
    fill(sem, {"small": 2, "big": 3, "mid": 2})
    refused(sem.attempt("plain", wait_lease=60))
    status = sem.status()
    assert (status.fair_keys_waiting, status.fair_keys_read, status.fair_grants) == (3, 3, 0)
    assert status.fair_keys == [
        FairKeyInfo("big", 3, 0, 0.0),
        FairKeyInfo("mid", 2, 0, 0.0),  # ties: by key
        FairKeyInfo("small", 2, 0, 0.0),
    ]
    keys = {w.holder: w.fair_key for w in status.waiters}
    assert keys == {
        **{f"small-{i}": "small" for i in range(2)},
        **{f"big-{i}": "big" for i in range(3)},
        **{f"mid-{i}": "mid" for i in range(2)},
        "plain": None,
    }
    # three grants: the first three in line, whichever keys they are
    first, holding = status.waiters[:3], "holder"
    for waiter in first:
        assert sem.release(holding) is True
        granted(sem.attempt(waiter.holder, fair_key=waiter.fair_key))
        holding = waiter.holder
    status = sem.status()
    assert status.fair_grants == 3
    granted_to = [w.fair_key for w in first]
    expected = {key: granted_to.count(key) for key in ("big", "mid", "small")}
    assert {k.key: (k.grants, k.share) for k in status.fair_keys} == {
        key: (count, round(count / 3, 3)) for key, count in expected.items()
    }
    assert sum(k.waiting for k in status.fair_keys) == 7 - 3


def test_a_key_leaves_the_list_when_its_last_waiter_leaves_the_line(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(1)
    fill(sem, {"a": 1, "b": 2})
    sem.release("a-0")  # drops its place in line
    status = sem.status()
    assert status.fair_keys_waiting == 1
    assert [(k.key, k.waiting) for k in status.fair_keys] == [("b", 2)]


def test_a_line_without_fair_keys_shows_none(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(1)
    granted(sem.attempt("holder"))
    refused(sem.attempt("urgent", priority=3, wait_lease=60))  # weighted, not fair
    status = sem.status()
    assert (status.fair_keys_waiting, status.fair_grants, status.fair_keys_read) == (0, 0, 0)
    assert status.fair_keys == []
    assert [w.fair_key for w in status.waiters] == [None]


@pytest.fixture
def client(redis_session_server: RedisServer) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_session_server.url) as connection:
        yield connection


def server_minute(client: redis.Redis) -> int:
    """The Redis clock's minute, not within a second of its end (so a test's reads
    fall in it)."""
    seconds, _ = client.time()
    if seconds % 60 >= 59:
        time.sleep(60 - seconds % 60 + 0.1)
        seconds, _ = client.time()
    return int(seconds // 60)


@pytest.mark.parametrize(
    ("minutes_ago", "counted"),
    [(0, 5 + 9), (1, 5), (2, 0)],
    ids=["this minute: both", "the minute before: its count", "older: none"],
)
def test_grants_count_this_minute_and_the_one_before(
    make_semaphore: MakeSemaphore, client: redis.Redis, minutes_ago: int, counted: int
) -> None:
    """Records as count_fair_grant() leaves them: 5 grants in the record's minute, 9
    in the one before; rolled over by the server clock as the scripts do."""
    sem = make_semaphore(1)
    fill(sem, {"acme": 1, "other": 1})
    minute = server_minute(client) - minutes_ago
    tail = client.hget(sem.keys.meta, "f|acme").decode().split("|")[:3]
    client.hset(sem.keys.meta, "f|acme", "|".join([*tail, "5", str(minute), "9"]))
    client.hset(sem.keys.meta, "fair_grants", f"10|{minute}|10")
    status = sem.status()
    total = {0: 20, 1: 10, 2: 0}[minutes_ago]
    assert status.fair_grants == total
    acme = next(k for k in status.fair_keys if k.key == "acme")
    assert (acme.waiting, acme.grants) == (1, counted)
    assert acme.share == (round(counted / total, 3) if total else 0.0)


def test_many_keys_are_read_from_a_bounded_sample(
    make_semaphore: MakeSemaphore, client: redis.Redis
) -> None:
    """A line of 20,000 keys: status reads a few thousand of their records, and lists
    the FAIR_TOP with the most waiting among those."""
    sem = make_semaphore(1)
    fill(sem, {"real": 1})
    many = 20_000
    with client.pipeline(transaction=False) as pipe:
        for start in range(0, many, 1000):
            pipe.hset(
                sem.keys.meta,
                mapping={f"f|k{i}": f"0|{1 + i % 500}|0|0|0|0" for i in range(start, start + 1000)},
            )
        pipe.hincrby(sem.keys.meta, "n_fair_keys", many)
        pipe.execute()
    status = sem.status()
    assert status.fair_keys_waiting == many + 1
    assert 1000 <= status.fair_keys_read < 8000, "a sample, not the whole hash"
    assert len(status.fair_keys) == FAIR_TOP
    waiting = [k.waiting for k in status.fair_keys]
    assert waiting == sorted(waiting, reverse=True)
    assert waiting[0] >= 490  # the sample's top, not the first records found


class Monitor(threading.Thread):
    """The commands scripts run on Redis (MONITOR, client type 'lua') until ``ECHO stop``."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url)
        self.lua: list[str] = []
        self.ready = threading.Event()

    def run(self) -> None:
        with self.client.monitor() as monitor:
            self.ready.set()
            while True:
                seen = monitor.next_command()
                if seen["command"] == "ECHO stop":
                    return
                if seen["client_type"] == "lua":
                    self.lua.append(seen["command"])


def lua_commands_of_status(sem: Any, url: str) -> list[str]:
    monitor = Monitor(url)
    monitor.start()
    assert monitor.ready.wait(5)
    time.sleep(0.1)
    sem.status()
    with redis.Redis.from_url(url) as client:
        client.echo("stop")
    monitor.join(5)
    monitor.client.close()
    return monitor.lua


def test_status_reads_the_fair_records_only_while_fair_keys_wait(
    make_semaphore: MakeSemaphore, redis_session_server: RedisServer
) -> None:
    url = redis_session_server.url
    sem = make_semaphore(1)
    granted(sem.attempt("holder"))
    refused(sem.attempt("heavy", priority=2, wait_lease=60))  # weighted, no fair key
    plain = lua_commands_of_status(sem, url)
    assert not [c for c in plain if c.startswith("HSCAN") or " w|" in c], plain
    refused(sem.attempt("fair", fair_key="acme", wait_lease=60))
    fair = lua_commands_of_status(sem, url)
    assert [c for c in fair if c.startswith("HSCAN")]
    assert [c for c in fair if c.startswith("HMGET") and "w|heavy" in c], fair
    assert len(fair) > len(plain)
