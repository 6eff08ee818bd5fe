"""Behaviour of the semaphore core against a real redis-server, sync and asyncio alike.

Every test here runs twice: against :class:`Semaphore` and against
:class:`AsyncSemaphore` driven through the same calls (``async_as_sync.py``).

Covered here: acquire/release basics, re-entrance and fencing tokens, idempotent
release/renew, renew_many, lease expiry (and how fast a blocked waiter gets the freed
permit), runtime limit override and draining, status(), and the Redis keys (hash tag,
TTL, namespace). FIFO fairness is in test_fairness.py, errors in test_semaphore_errors.py.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from async_as_sync import BlockingPermit
from outcomes import granted, refused, script_calls, wait_for

from celery_semaphore import Permit, Semaphore
from celery_semaphore.core.redis.keys import ROLES
from devkit.redis_servers import RedisServer

MakeSemaphore = Callable[..., Semaphore]


def sleep_until(epoch: float) -> None:
    """Sleep until the given wall-clock time (Redis runs on this machine: same clock)."""
    time.sleep(max(0.0, epoch - time.time()))


def holder_ids(sem: Semaphore) -> list[str]:
    return [h.holder for h in sem.status().holders]


def waiter_ids(sem: Semaphore) -> list[str]:
    return [w.holder for w in sem.status().waiters]


class BlockedAcquire(threading.Thread):
    """Runs ``sem.acquire(...)`` in a thread; keeps the permit or the exception."""

    def __init__(self, sem: Semaphore, **kwargs: Any) -> None:
        super().__init__(daemon=True)
        self.sem, self.kwargs = sem, kwargs
        self.permit: Permit | None = None
        self.error: BaseException | None = None
        self.granted_at: float | None = None

    def run(self) -> None:
        try:
            self.permit = self.sem.acquire(**self.kwargs)
            self.granted_at = time.monotonic()
        except BaseException as exc:
            self.error = exc

    def result(self, timeout: float = 10.0) -> Permit:
        self.join(timeout)
        assert not self.is_alive(), "acquire() is still blocked"
        assert self.error is None, repr(self.error)
        assert self.permit is not None
        return self.permit


# --------------------------------------------------------------------------- basics


def test_acquire_up_to_the_limit_then_refuse(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(3)
    permits = [granted(sem.attempt(f"h{i}")) for i in range(3)]
    place = refused(sem.attempt("h3"))
    assert (place.holders, place.limit, place.position, place.draining) == (3, 3, 1, False)
    assert place.ticket > 0
    assert sem.try_acquire("h4") is None
    assert sem.status().holder_count == 3
    assert permits[0].release() is True
    # h3 queued first: it gets the freed permit, h4 (queued after it) does not.
    assert sem.try_acquire("h4") is None
    assert granted(sem.attempt("h3")).holder == "h3"


def test_context_managers_release_on_exit(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(2)
    with sem as outer:
        assert isinstance(outer, Permit | BlockingPermit)
        with sem as inner:
            assert set(holder_ids(sem)) == {outer.holder, inner.holder}
            refused(sem.attempt("other", queue=False))
        assert holder_ids(sem) == [outer.holder], "the inner block released the wrong permit"
    assert sem.status().holder_count == 0
    with pytest.raises(KeyError), sem.acquire(timeout=1):
        raise KeyError("boom")
    assert sem.status().holder_count == 0, "the permit was not released on an exception"


def test_acquire_timeout_raises_and_leaves_the_line(make_semaphore: MakeSemaphore) -> None:
    from celery_semaphore import SemaphoreTimeout

    sem = make_semaphore(1)
    granted(sem.attempt("holder"))
    started = time.monotonic()
    with pytest.raises(SemaphoreTimeout) as info:
        sem.acquire(timeout=0.3, holder="late")
    elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 2.0
    assert isinstance(info.value, TimeoutError)
    assert (info.value.name, info.value.limit) == (sem.name, 1)
    assert sem.status().waiter_count == 0, "a timed-out waiter must leave the line"
    with pytest.raises(SemaphoreTimeout):
        sem.acquire(timeout=0)
    assert sem.status().waiter_count == 0


# ------------------------------------------------------------ re-entrance and fencing


def test_reentrant_acquire_gets_a_new_token_and_keeps_one_slot(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(2)
    first = granted(sem.attempt("a"))
    again = granted(sem.attempt("a"))
    assert again.fencing_token > first.fencing_token
    assert sem.status().holder_count == 1
    granted(sem.attempt("b"))  # the second slot is still free
    refused(sem.attempt("c"))
    # Re-entrance works even when the semaphore is full, and through acquire().
    third = sem.acquire(holder="a", timeout=0)
    assert third.fencing_token > again.fencing_token
    assert sem.status().holder_count == 2
    assert [h.fencing_token for h in sem.status().holders if h.holder == "a"] == [
        third.fencing_token
    ]


def test_fencing_tokens_strictly_increase_even_after_flushall(
    make_semaphore: MakeSemaphore, redis_server: RedisServer
) -> None:
    sem = make_semaphore(2, url=redis_server.url, name="fence", lease_timeout=0.05)
    tokens = []
    for i in range(20):
        permit = granted(sem.attempt(f"h{i % 3}"))
        tokens.append(permit.fencing_token)
        if i % 2:
            permit.release()
    time.sleep(0.1)  # let the leases run out: reclaimed holders, new grants
    tokens.append(granted(sem.attempt("late")).fencing_token)
    with redis_server.client() as client:
        client.delete(*sem.keys.script_keys)
        tokens.append(granted(sem.attempt("after-del")).fencing_token)
        client.flushall()  # a data loss: no grant until the pause after it ends
        place = refused(sem.attempt("after-flush"))
        assert place.resumes_in is not None
        time.sleep(place.resumes_in + 0.05)
        tokens.append(granted(sem.attempt("after-flush")).fencing_token)
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens


# ------------------------------------------------------------------- idempotence


def test_release_is_idempotent(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(1)
    permit = granted(sem.attempt("a"))
    assert permit.release() is True
    assert permit.release() is False
    assert sem.release("a") is False
    assert sem.release("never-seen") is False
    permit = granted(sem.attempt("a"))
    assert sem.release("a") is True
    assert sem.release("a") is False
    assert permit.release() is False


def test_renew_extends_and_a_lost_permit_stays_lost(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(1, lease_timeout=5)
    permit = granted(sem.attempt("a"))
    before = permit.expires_at
    time.sleep(0.01)
    assert permit.renew(lease_timeout=60) is True
    assert permit.expires_at > before + 50
    assert sem.status().holders[0].expires_at == pytest.approx(permit.expires_at, abs=0.002)
    assert permit.release() is True
    assert permit.renew() is False
    assert sem.status().holder_count == 0, "renew must never resurrect a released permit"


def test_renew_after_the_lease_ran_out_fails_even_if_nobody_else_ran(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(1, lease_timeout=0.2)
    permit = granted(sem.attempt("a"))
    sleep_until(permit.expires_at + 0.05)
    # No other client touched the semaphore since: the expired holder is still in the
    # holders zset, but renew must see that its lease ended and report it lost.
    assert permit.renew() is False
    assert permit.renew() is False
    assert sem.status().holder_count == 0
    assert sem.client.zcard(sem.keys.holders) == 0
    assert permit.release() is False
    assert sem.renew_many(["a"]) == {"a"}


def test_a_stale_permit_cannot_touch_the_newer_permit_of_its_holder(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(1)
    old = granted(sem.attempt("a"))
    new = granted(sem.attempt("a"))  # re-entrant: same holder, newer token
    assert old.renew() is False
    assert old.release() is False
    assert sem.status().holders[0].fencing_token == new.fencing_token
    assert new.renew() is True
    assert new.release() is True
    # The same after a release and a fresh acquisition by the same holder id.
    first = granted(sem.attempt("b"))
    assert first.release() is True
    second = granted(sem.attempt("b"))
    assert first.release() is False
    assert first.renew() is False
    assert sem.renew_many([first, second]) == {"b"}  # the stale one is reported lost
    assert holder_ids(sem) == ["b"]
    assert second.release() is True


# --------------------------------------------------------------------- renew_many


def test_renew_many_renews_all_live_and_returns_exactly_the_lost(
    make_semaphore: MakeSemaphore, redis_server: RedisServer
) -> None:
    sem = make_semaphore(20, url=redis_server.url, name="many", lease_timeout=5)
    permits = {f"h{i}": granted(sem.attempt(f"h{i}")) for i in range(12)}
    short = granted(sem.attempt("short", lease_timeout=0.05))
    permits["h3"].release()
    sem.release("h7")
    time.sleep(0.1)  # "short" runs out
    assert (
        sem.renew_many(["h0"]) == set()
    )  # loads the script (or the library): the next call runs it at once
    stats = redis_server.client()
    try:
        calls_before = script_calls(stats)[0]
        lost = sem.renew_many([*permits, "short", "never-acquired"], lease_timeout=100)
        calls_after = script_calls(stats)[0]
    finally:
        stats.close()
    assert lost == {"h3", "h7", "short", "never-acquired"}
    assert calls_after - calls_before == 1, "renew_many must be one round trip"
    status = sem.status()
    assert {h.holder for h in status.holders} == set(permits) - {"h3", "h7"}
    for holder in status.holders:
        assert holder.expires_at > status.server_time + 99
    assert short.renew() is False
    # Permit objects: their expires_at is updated, lost ones are reported.
    live = [permits["h0"], permits["h1"]]
    assert sem.renew_many([*live, permits["h3"]], lease_timeout=200) == {"h3"}
    assert all(p.expires_at > time.time() + 199 for p in live)
    assert sem.renew_many([]) == set()


# ------------------------------------------------------------------------- expiry


def test_a_holder_that_stops_renewing_loses_the_permit_after_its_lease(
    make_semaphore: MakeSemaphore,
) -> None:
    lease = 0.6
    sem = make_semaphore(1, lease_timeout=lease)
    permit = granted(sem.attempt("sleepy"))
    other = make_semaphore(1, name=sem.name)  # another client of the same semaphore

    sleep_until(permit.expires_at - 0.05)
    status = other.status()
    assert status.server_time < permit.expires_at, "the check ran too late to mean anything"
    assert [h.holder for h in status.holders] == ["sleepy"]
    assert status.holder_count == 1
    refused(other.attempt("eager"))

    sleep_until(permit.expires_at + 0.1)
    assert other.release("unrelated") is False  # any operation reclaims expired holders
    assert other.client.zcard(sem.keys.holders) == 0
    assert other.client.hget(sem.keys.hinfo, "sleepy") is None
    assert other.status().holder_count == 0
    assert granted(other.attempt("eager")).holder == "eager"
    assert permit.renew() is False
    assert permit.release() is False


def test_a_renewing_holder_keeps_its_permit(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(1, lease_timeout=0.3)
    permit = granted(sem.attempt("busy"))
    for _ in range(6):
        time.sleep(0.1)
        assert permit.renew() is True
    refused(sem.attempt("eager"))
    assert holder_ids(sem) == ["busy"]


def test_a_blocked_waiter_gets_the_permit_within_100ms_of_the_lease_expiry(
    make_semaphore: MakeSemaphore,
) -> None:
    # Default recheck_interval (2 s): the waiter must not rely on polling, but sleep
    # exactly until the earliest lease end it was told about, then retry.
    sem = make_semaphore(1, lease_timeout=10)
    stuck = granted(sem.attempt("stuck", lease_timeout=0.8))
    waiter = BlockedAcquire(sem, holder="waiter", timeout=10)
    waiter.start()
    wait_for(lambda: waiter_ids(sem) == ["waiter"], what="the waiter to queue")
    permit = waiter.result()
    # Both times are on the Redis server clock (ms): the grant time is the permit's
    # lease end minus its lease. 100 ms is the requirement; the implementation sleeps
    # until the lease end + 2 ms, so this holds with a wide margin even on a busy box.
    granted_at = permit.expires_at - sem.lease_timeout
    latency = granted_at - stuck.expires_at
    assert 0 <= latency < 0.1, f"granted {latency * 1000:.0f} ms after the lease ran out"


# ---------------------------------------------------- runtime limit and draining


def test_lowering_the_limit_evicts_nobody_and_admits_nobody_until_below(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(3)
    permits = [granted(sem.attempt(h)) for h in "abc"]
    assert sem.set_limit(1) is None
    status = sem.status()
    assert (status.declared_limit, status.override, status.effective_limit) == (3, 1, 1)
    assert status.holder_count == 3
    assert sem.renew_many(permits) == set(), "lowering the limit must evict nobody"
    assert refused(sem.attempt("d")).limit == 1
    assert permits[0].release()
    refused(sem.attempt("d"))  # 2 holders, limit 1
    assert permits[1].release()
    refused(sem.attempt("d"))  # 1 holder, limit 1
    assert permits[2].release()
    granted(sem.attempt("d"))
    refused(sem.attempt("e"))
    assert sem.set_limit(2) == 1
    granted(sem.attempt("e"))
    assert sem.clear_limit() == 2
    status = sem.status()
    assert (status.override, status.effective_limit) == (None, 3)
    granted(sem.attempt("f"))
    refused(sem.attempt("g"))
    assert sem.clear_limit() is None


def test_the_override_applies_to_every_client(make_semaphore: MakeSemaphore) -> None:
    first = make_semaphore(1)
    second = make_semaphore(1, name=first.name)
    first.set_limit(2)
    granted(second.attempt("a"))
    granted(second.attempt("b"))
    refused(first.attempt("c"))


def test_raising_the_limit_wakes_a_blocked_acquire_promptly(make_semaphore: MakeSemaphore) -> None:
    # recheck_interval 5 s and a 30 s lease: only the wake-up message can make it prompt.
    sem = make_semaphore(1, lease_timeout=30, recheck_interval=5)
    granted(sem.attempt("holder"))
    waiter = BlockedAcquire(sem, holder="waiter", timeout=20)
    waiter.start()
    wait_for(lambda: waiter_ids(sem) == ["waiter"], what="the waiter to queue")
    time.sleep(0.2)  # let it subscribe and go to sleep
    raised_at = time.monotonic()
    sem.set_limit(2)
    waiter.result()
    assert waiter.granted_at is not None
    assert waiter.granted_at - raised_at < 0.5


def test_draining_admits_nobody_and_resuming_wakes_waiters(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(3, recheck_interval=5)
    keeper = granted(sem.attempt("keeper"))
    assert sem.set_draining(True) is False
    place = refused(sem.attempt("newcomer", queue=False))
    assert place.draining is True
    assert place.ticket == 0
    assert sem.status().draining is True
    assert keeper.renew() is True, "draining lets holders finish"
    waiter = BlockedAcquire(sem, holder="waiter", timeout=20)
    waiter.start()
    wait_for(lambda: waiter_ids(sem) == ["waiter"], what="the waiter to queue")
    time.sleep(0.2)
    assert waiter.is_alive()
    resumed_at = time.monotonic()
    assert sem.set_draining(False) is True
    waiter.result()
    assert waiter.granted_at is not None
    assert waiter.granted_at - resumed_at < 0.5
    assert sem.status().draining is False
    granted(sem.attempt("newcomer"))


# ------------------------------------------------------------------------- status


def test_status_lists_holders_with_expiry_and_waiters_in_order(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(2, lease_timeout=30, waiter_lease=40)
    a = granted(sem.attempt("a", info="task-a"))
    time.sleep(0.002)
    b = granted(sem.attempt("b", lease_timeout=60, info="task-b"))
    places = [refused(sem.attempt(h, info=f"task-{h}")) for h in ("c", "d", "e")]
    refused(sem.attempt("gone", wait_lease=0.05))
    time.sleep(0.1)  # "gone" lets its place lapse
    status = sem.status()
    now = time.time()
    assert status.name == sem.name
    assert (status.declared_limit, status.override, status.effective_limit) == (2, None, 2)
    assert status.draining is False
    assert status.server_time == pytest.approx(now, abs=1.0)
    assert (status.holder_count, status.waiter_count) == (2, 3)
    assert [h.holder for h in status.holders] == ["a", "b"]
    for info, permit in zip(status.holders, (a, b), strict=True):
        assert info.fencing_token == permit.fencing_token
        assert info.expires_at == pytest.approx(permit.expires_at, abs=0.001)
        assert info.acquired_at <= status.server_time < info.expires_at
        assert info.info == f"task-{permit.holder}"
    assert status.holders[1].expires_at - status.holders[1].acquired_at == pytest.approx(60, 0.01)
    assert [w.holder for w in status.waiters] == ["c", "d", "e"]
    assert [w.position for w in status.waiters] == [1, 2, 3]
    assert [w.ticket for w in status.waiters] == [p.ticket for p in places]
    for waiter in status.waiters:
        assert waiter.since <= status.server_time < waiter.expires_at
        assert waiter.expires_at == pytest.approx(waiter.since + 40, abs=0.5)
        assert waiter.info == f"task-{waiter.holder}"


def test_status_of_an_unused_semaphore(make_semaphore: MakeSemaphore) -> None:
    status = make_semaphore(4).status()
    assert (status.holder_count, status.waiter_count, status.holders, status.waiters) == (
        0,
        0,
        [],
        [],
    )
    assert (status.declared_limit, status.override, status.effective_limit) == (None, None, 4)


def test_a_place_taken_without_asking_says_where_it_stands_and_records_the_limit(
    make_semaphore: MakeSemaphore,
) -> None:
    """take_place (at publish): position behind every waiter, the holders and the
    effective limit; the declared limit is recorded, so status() reads it before any
    attempt; taking the place again keeps the ticket."""
    sem = make_semaphore(2)
    first = sem.take_place("p1", wait_lease=30)
    assert (first.position, first.holders, first.limit, first.draining) == (1, 0, 2, False)
    assert sem.status().declared_limit == 2
    permit = sem.attempt("p1", first.ticket)
    assert granted(permit)
    later = [sem.take_place(f"w{i}", wait_lease=30) for i in range(3)]
    assert [(p.position, p.holders) for p in later] == [(1, 1), (2, 1), (3, 1)]
    again = sem.take_place("w1", wait_lease=30)
    assert (again.ticket, again.position) == (later[1].ticket, 2)
    assert sem.take_place("w2", wait_lease=30).ticket == later[2].ticket
    sem.set_limit(5)
    assert sem.take_place("w3", wait_lease=30).limit == 5
    sem.set_draining(True)
    assert sem.take_place("w4", wait_lease=30).draining


def test_a_task_sent_with_a_place_is_seen_until_it_asks_even_after_its_place_lapsed(
    make_semaphore: MakeSemaphore,
) -> None:
    """Issue: `status` showed WAIT 0 while tasks sat in the broker, their places taken
    at publish lapsed. They stay counted (sent) until they ask or are released."""
    sem = make_semaphore(1)
    for holder in ("t1", "t2", "t3"):
        sem.take_place(holder, wait_lease=0.2)
    status = sem.status()
    assert (status.waiter_count, status.sent_count, status.sent_without_place) == (3, 3, [])
    time.sleep(0.3)  # the places lapse; the messages are still in the broker
    status = sem.status()
    assert (status.waiter_count, status.sent_count) == (0, 3)
    assert [w.holder for w in status.sent_without_place] == ["t1", "t2", "t3"]
    assert status.sent_without_place_count == 3
    assert {w.state for w in status.sent_without_place} == {"in broker"}
    assert granted(sem.attempt("t1"))  # t1 reached a worker
    assert sem.release("t3") is False  # revoked before it asked: nothing held, forgotten
    status = sem.status()
    assert status.sent_count == 1
    assert [w.holder for w in status.sent_without_place] == ["t2"]


def test_a_task_parked_at_publish_is_parked_not_sent(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(1, on_handover=lambda handovers: None)
    assert granted(sem.attempt("holder"))
    place = sem.take_place("t1", wait_lease=30)
    assert sem.status().sent_count == 1
    sem.park("t1", "payload", place.ticket)  # its message stays in Redis until its turn
    status = sem.status()
    assert (status.sent_count, status.parked_count, status.waiter_count) == (0, 1, 1)


def test_a_refused_anonymous_try_acquire_keeps_no_place_but_a_named_one_does(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(1)
    held = granted(sem.attempt("holder"))
    assert sem.try_acquire() is None
    assert waiter_ids(sem) == [], "an anonymous poller left a place nobody comes back to"
    assert sem.try_acquire("named") is None
    assert waiter_ids(sem) == ["named"]
    held.release()
    assert sem.try_acquire() is None, "the named poller's place comes first"
    assert sem.try_acquire("named") is not None


def test_polling_try_acquire_without_a_holder_id_does_not_starve_the_pollers(
    make_semaphore: MakeSemaphore,
) -> None:
    """8 threads poll ``try_acquire()`` (the loop most people write) against a limit
    of 2 for 1.5 s, holding each permit 5 ms. Refused anonymous polls used to leave
    places that blocked the line for the waiter lease: a handful of grants in all."""
    sem = make_semaphore(2)
    grants = [0] * 8
    stop = time.monotonic() + 1.5

    def poll(index: int) -> None:
        while time.monotonic() < stop:
            permit = sem.try_acquire()
            if permit is None:
                time.sleep(0.002)
                continue
            grants[index] += 1
            time.sleep(0.005)
            permit.release()

    threads = [threading.Thread(target=poll, args=(i,)) for i in range(len(grants))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(grants) >= 50, grants  # hundreds when nobody starves; ~2 when they do
    assert sem.status().waiter_count == 0


# --------------------------------------------------------------------------- keys


def hash_tag(key: str) -> str:
    """The part of a key Redis Cluster hashes (the rule of the cluster spec, verbatim):
    if the key has a ``{`` followed later by a ``}`` with at least one character between
    the first ``{`` and the first ``}`` after it, only that part; else the whole key."""
    start = key.find("{")
    if start != -1:
        end = key.find("}", start + 1)
        if end != -1 and end != start + 1:
            return key[start + 1 : end]
    return key


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM), the one Redis Cluster uses for slots."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def slot(key: str) -> int:
    return crc16(hash_tag(key).encode()) % 16384


def test_slot_helpers_match_the_cluster_spec() -> None:
    assert crc16(b"123456789") == 0x31C3  # the spec's check value
    assert hash_tag("{user1000}.following") == "user1000"
    assert hash_tag("foo{}{bar}") == "foo{}{bar}"
    assert hash_tag("foo{{bar}}zap") == "{bar"
    assert hash_tag("foo{bar}{zap}") == "bar"
    assert slot("{user1000}.following") == slot("{user1000}.followers")


NAMES = ["plain", "a{b}c", "}{", "{", "}", "{}", "{{x}}", "a%7Bb", "%", "%25", "é{ü}", "x" * 160]


@pytest.mark.parametrize("name", NAMES)
def test_all_keys_of_a_semaphore_share_one_hash_tag(
    make_semaphore: MakeSemaphore, name: str
) -> None:
    name += uuid.uuid4().hex  # unique on the shared server; braces stay where they are
    sem = make_semaphore(1, name=name)
    keys = [*sem.keys.script_keys, sem.keys.channel]
    assert len(set(keys)) == len(ROLES) + 1  # and the wake-up channel
    tags = {hash_tag(key) for key in keys}
    assert len(tags) == 1, keys
    (tag,) = tags
    assert all(tag != key for key in keys), "the keys must have a real hash tag"
    assert len({slot(key) for key in keys}) == 1
    assert all(key.startswith("celery_semaphore:") for key in keys)
    assert [key.rsplit(":", 1)[1] for key in sem.keys.script_keys] == list(ROLES)
    assert sem.keys.epoch == "celery_semaphore:epoch"  # one per Redis
    # The semaphore works under that name, and status() reports the name as given.
    granted(sem.attempt("a"))
    assert sem.status().name == name
    assert sem.status().holder_count == 1


def test_names_differing_only_by_braces_do_not_collide(make_semaphore: MakeSemaphore) -> None:
    names = ["ab", "{ab}", "a{b", "a}b", "{a}b", "a{}b", "a%7Bb", "a%7Db", "a%257Bb", "%7B", "{"]
    unique = uuid.uuid4().hex
    names = [unique + name for name in names]
    sems = [make_semaphore(1, name=name) for name in names]
    all_keys = [key for sem in sems for key in (*sem.keys.script_keys, sem.keys.channel)]
    assert len(set(all_keys)) == len(all_keys)
    assert len({hash_tag(sem.keys.holders) for sem in sems}) == len(names)
    # Each is its own semaphore: every one of them (limit 1) can be held at once.
    for sem in sems:
        granted(sem.attempt("same-holder"))
    for sem in sems:
        assert sem.status().holder_count == 1


def test_keys_get_a_ttl_and_expire_when_idle(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(1, lease_timeout=0.1, waiter_lease=0.1, idle_ttl=0.4)
    permit = granted(sem.attempt("a"))
    refused(sem.attempt("b"))
    client = sem.client
    existing = [key for key in sem.keys.script_keys if client.exists(key)]
    # All but parked and handed, which exist only while waiters park (test_parking.py).
    assert set(existing) == set(sem.keys.script_keys[:6])
    for key in existing:
        assert 0 < client.pttl(key) <= 400, key
    permit.release()
    time.sleep(0.6)
    assert client.exists(*sem.keys.script_keys) == 0, "idle keys must expire"
    # ...and the semaphore works from scratch afterwards.
    granted(sem.attempt("c"))


def test_uncontended_calls_touch_the_keys_lazily_and_they_never_lapse_in_use(
    make_semaphore: MakeSemaphore, redis_session_server: RedisServer
) -> None:
    """acquire and release skip the touch while the last one left 15/16 of the idle
    time (common_meta.lua, touch_due()): used for longer than the idle time, the keys
    stay; idle, they go within it."""
    sem = make_semaphore(3, lease_timeout=0.4, waiter_lease=0.1, idle_ttl=0.8)
    keeper = granted(sem.attempt("keeper"))  # the holder keys exist throughout
    with redis_session_server.client() as stats:
        stats.config_resetstat()
        for i in range(20):
            granted(sem.attempt(f"quick-{i}")).release()
        pexpires = stats.info("commandstats").get("cmdstat_pexpire", {}).get("calls", 0)
    assert pexpires <= 6, f"{pexpires} PEXPIREs in 20 cycles (3 a call if touched each time)"
    keeper.release()
    ended = time.monotonic() + 1.2  # longer than the idle time, a cycle every 20 ms
    while time.monotonic() < ended:
        granted(sem.attempt("busy")).release()
        assert sem.client.pttl(sem.keys.meta) > 800 * 15 / 16 - 150
        time.sleep(0.02)
    assert sem.status().holder_count == 0
    time.sleep(1.0)
    assert sem.client.exists(*sem.keys.script_keys) == 0, "idle keys expire within the idle time"


def test_meta_becomes_a_hash_table_once_a_line_forms_and_stays_one(
    make_semaphore: MakeSemaphore,
) -> None:
    """Redis keeps a hash of few short fields as a listpack, where every field lookup
    scans the hash (common_meta.lua, LAYOUT): meta stays one while nobody waits, and
    becomes a hash table at the first touch with a line, for good."""
    sem = make_semaphore(1, lease_timeout=30, waiter_lease=30)
    client = sem.client
    for i in range(5):
        granted(sem.attempt(f"alone-{i}")).release()
    assert client.object("encoding", sem.keys.meta) == b"listpack"
    assert client.hget(sem.keys.meta, "layout") is None
    permit = granted(sem.attempt("a"))
    refused(sem.attempt("b"))  # a line: this acquire touches with one
    permit.release()
    assert client.object("encoding", sem.keys.meta) == b"hashtable"
    granted(sem.attempt("b")).release()  # its line is gone; meta stays a hash table
    assert client.object("encoding", sem.keys.meta) == b"hashtable"
    assert sem.status().waiter_count == 0


def test_a_grant_that_waited_no_time_adds_nothing_to_the_sums_it_has_no_part_in(
    make_semaphore: MakeSemaphore,
) -> None:
    """observe() adds a wait or hold to its histogram's sum only from 1 ms on (the sum
    is in whole ms): the bucket counts every one."""
    sem = make_semaphore(2)
    granted(sem.attempt("a")).release()
    fields = sem.client.hmget(sem.keys.meta, "m_wait_b0", "m_wait_sum", "m_hold_b0", "m_granted")
    assert fields[0] == b"1" and fields[3] == b"1"
    assert fields[1] is None  # 0 ms waited
    permit = granted(sem.attempt("b"))
    time.sleep(0.02)
    permit.release()
    meta = sem.client.hmget(sem.keys.meta, "m_hold_b0", "m_hold_b1", "m_hold_sum")
    assert int(meta[0] or 0) + int(meta[1] or 0) == 2
    assert 20 <= int(meta[2]) < 1000


def test_a_touch_by_a_caller_with_a_shorter_idle_time_is_not_skipped_over(
    make_semaphore: MakeSemaphore,
) -> None:
    """Two processes that declare other idle times: after the short one's touch (here
    by set_limit; a place taken at publish or a renewal touch alike), the long one's
    next calls touch again, so the keys live by its idle time, not the short one's."""
    long = make_semaphore(3, lease_timeout=5, waiter_lease=5, idle_ttl=30)
    short = make_semaphore(3, name=long.name, lease_timeout=0.4, waiter_lease=0.1, idle_ttl=0.8)
    granted(long.attempt("a")).release()
    keeper = granted(long.attempt("keeper"))
    assert long.client.pttl(long.keys.meta) > 25_000
    short.set_limit(3)
    assert long.client.pttl(long.keys.meta) <= 800
    granted(long.attempt("b")).release()
    assert long.client.pttl(long.keys.meta) > 25_000, "touched again by the long one"
    keeper.release()


def test_holder_keys_made_by_a_shorter_idle_time_live_as_long_as_the_noted_touch(
    make_semaphore: MakeSemaphore,
) -> None:
    """The first holder's call, when it skips the touch, expires the holder keys it
    makes no sooner than the touch the long one noted: else the long one's later calls,
    skipping theirs, would hold permits in keys due to expire by the short idle time."""
    long = make_semaphore(3, lease_timeout=5, waiter_lease=5, idle_ttl=30)
    short = make_semaphore(3, name=long.name, lease_timeout=0.4, waiter_lease=0.1, idle_ttl=0.8)
    granted(long.attempt("a")).release()  # noted: the keys expire in 30 s
    assert long.client.exists(long.keys.holders) == 0
    first = granted(short.attempt("first"))  # makes the holder keys, skips the touch
    second = granted(long.attempt("second"))  # skips it too
    assert long.client.pttl(long.keys.holders) > 25_000
    assert long.client.pttl(long.keys.hinfo) > 25_000
    first.release()
    second.release()


def test_a_limit_set_before_first_use_waits_for_it_then_expires_when_idle(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(5, lease_timeout=0.1, waiter_lease=0.1, idle_ttl=0.4)
    client = sem.client
    assert sem.set_limit(2) is None
    time.sleep(0.6)
    assert client.pttl(sem.keys.meta) == -1, "nothing refreshes it before the first use"
    first, second = granted(sem.attempt("a")), granted(sem.attempt("b"))
    refused(sem.attempt("c"))
    assert 0 < client.pttl(sem.keys.meta) <= 400, "idle expiry from the first use on"
    first.release()
    second.release()
    time.sleep(0.6)
    assert client.exists(*sem.keys.script_keys) == 0, "the override expired with the rest"
    assert sem.status().override is None
    for holder in "def":  # the declared 5 again
        granted(sem.attempt(holder))


def test_a_task_counts_as_sent_for_the_sent_horizon_at_most(
    make_semaphore: MakeSemaphore,
) -> None:
    """A message the broker lost (purged queue, failed publish) is not counted forever:
    after the horizon (an hour, at most the idle time; here 0.4 s) it is forgotten."""
    sem = make_semaphore(1, lease_timeout=0.1, waiter_lease=0.1, idle_ttl=0.4)
    sem.take_place("lost", wait_lease=0.1)
    time.sleep(0.2)
    status = sem.status()
    assert (status.sent_count, status.sent_without_place_count) == (1, 1)
    time.sleep(0.3)
    status = sem.status()
    assert (status.sent_count, status.sent_without_place_count) == (0, 0)
    assert status.sent_without_place == []


def test_default_idle_ttl_is_long_but_finite(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(1)
    granted(sem.attempt("a"))
    ttl = sem.client.ttl(sem.keys.holders)
    assert 6 * 24 * 3600 < ttl <= 7 * 24 * 3600


def test_namespace_is_honoured(make_semaphore: MakeSemaphore) -> None:
    name = f"ns-{uuid.uuid4().hex}"
    mine = make_semaphore(1, name=name, namespace="myapp")
    theirs = make_semaphore(1, name=name, namespace="otherapp")
    assert all(key.startswith("myapp:{") for key in (*mine.keys.script_keys, mine.keys.channel))
    assert mine.keys.epoch == "myapp:epoch"
    granted(mine.attempt("a"))
    granted(theirs.attempt("b"))  # same name, other namespace: another semaphore
    client = mine.client
    assert client.exists(mine.keys.holders)
    assert set(client.scan_iter(match=f"*{name}*")) == {
        key.encode()
        for key in (*mine.keys.script_keys, *theirs.keys.script_keys)
        if client.exists(key)
    }
    assert not list(client.scan_iter(match=f"celery_semaphore:*{name}*"))
