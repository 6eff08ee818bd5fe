"""Several semaphores taken in one step (sync and asyncio alike), on a real Redis.

A `SemaphoreSet` grants a contender a permit on every one of its semaphores in one
script call, or on none: refused, it holds nothing, and stands in line with one
ticket in the semaphores that refused it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from async_as_sync import BlockingSemaphore, BlockingSemaphoreSet
from outcomes import granted, refused, wait_for

from celery_semaphore import (
    Places,
    RateLimit,
    Semaphore,
    SemaphoreSet,
    SemaphoreTimeout,
    StaleHandover,
)
from devkit.redis_servers import RedisClusterServers, RedisServer

MakeSemaphore = Callable[..., Any]
MakeSet = Callable[..., Any]


@pytest.fixture
def make_set() -> MakeSet:
    """A set of the given semaphores, of the same API as they are (sync or asyncio)."""

    def make(*semaphores: Any) -> Any:
        if isinstance(semaphores[0], BlockingSemaphore):
            return BlockingSemaphoreSet(semaphores[0]._loop, semaphores)
        return SemaphoreSet(semaphores)

    return make


def refused_all(result: Any) -> Places:
    assert isinstance(result, Places), f"expected a refusal, got {result!r}"
    return result


def holders(sem: Any) -> set[str]:
    return {h.holder for h in sem.status().holders}


def waiters(sem: Any) -> dict[str, tuple[int, str]]:
    return {w.holder: (w.ticket, w.state) for w in sem.status().waiters}


def meta(sem: Any, field: str) -> str | None:
    value = sem.client.hget(sem.keys.meta, field)
    return None if value is None else value.decode()


def test_a_full_semaphore_refuses_the_set_and_nothing_is_taken_on_the_other(
    make_semaphore: MakeSemaphore, make_set: MakeSet
) -> None:
    full = make_semaphore(1)
    paced = make_semaphore(2, rate=RateLimit(1, 60.0, burst=1))
    both = make_set(full, paced)
    other = granted(full.attempt("other"))
    granted_before = meta(paced, "m_granted")

    places = refused_all(both.attempt("job"))
    assert places.refused_by == (0,)
    assert holders(paced) == set(), "no permit on the semaphore that would have admitted it"
    assert meta(paced, "tat") is None, "no grant of its rate spent"
    assert meta(paced, "m_granted") == granted_before
    assert paced.status().rate_room == 1
    assert set(waiters(full)) == {"job"}, "in line where it was refused"
    assert waiters(paced) == {}, "and nowhere else (no hold-back asked)"
    assert places.places[1].ticket == 0 and places.places[0].ticket == places.ticket

    other.release()
    permits = granted(both.attempt("job", places.ticket))
    assert [p.semaphore.name for p in permits] == [full.name, paced.name]
    assert holders(full) == holders(paced) == {"job"}
    assert paced.status().rate_room == 0, "the rate's grant is spent by the joint grant"
    assert waiters(full) == waiters(paced) == {}
    assert permits.release() is True
    assert holders(full) == holders(paced) == set()


def test_a_refused_set_keeps_one_ticket_in_every_line_and_serves_in_its_order(
    make_semaphore: MakeSemaphore, make_set: MakeSet
) -> None:
    a, b = make_semaphore(1), make_semaphore(1)
    both = make_set(a, b)
    first_a, first_b = granted(a.attempt("ha")), granted(b.attempt("hb"))
    p = refused_all(both.attempt("p"))
    q = refused_all(both.attempt("q"))
    assert p.refused_by == q.refused_by == (0, 1)
    assert 0 < p.ticket < q.ticket
    for sem in (a, b):
        assert waiters(sem) == {"p": (p.ticket, "asking"), "q": (q.ticket, "asking")}
        assert int(meta(sem, "ticket") or 0) == q.ticket, "the new ticket written to every line"
    first_a.release()
    first_b.release()
    assert refused_all(both.attempt("q", q.ticket)).refused_by == (0, 1), "p is ahead in both"
    granted(both.attempt("p", p.ticket)).release()
    granted(both.attempt("q", q.ticket)).release()


def test_the_smallest_ticket_it_has_anywhere_is_its_ticket_in_every_line(
    make_semaphore: MakeSemaphore, make_set: MakeSet
) -> None:
    """Crossed places (t ahead of u in a, u ahead of t in b) cannot deadlock: each
    asks with its smaller ticket in both lines, so they are in one order."""
    a, b = make_semaphore(1), make_semaphore(1)
    both = make_set(a, b)
    hold_a, hold_b = granted(a.attempt("ha")), granted(b.attempt("hb"))
    t_a = refused(a.attempt("t")).ticket
    u_a = refused(a.attempt("u")).ticket
    u_b = refused(b.attempt("u")).ticket
    t_b = refused(b.attempt("t")).ticket
    assert t_a < u_a < u_b < t_b
    assert refused_all(both.attempt("t")).ticket == t_a
    assert refused_all(both.attempt("u")).ticket == u_a
    assert waiters(b)["t"][0] == t_a, "t moved ahead of u in b"
    hold_a.release()
    hold_b.release()
    assert refused_all(both.attempt("u")).refused_by == (0, 1)
    granted(both.attempt("t")).release()
    granted(both.attempt("u")).release()


def test_an_admitting_line_is_held_back_only_on_request(
    make_semaphore: MakeSemaphore, make_set: MakeSet
) -> None:
    a, b = make_semaphore(1), make_semaphore(1)
    both = make_set(a, b)
    hold_a = granted(a.attempt("ha"))
    refused_all(both.attempt("joint"))
    granted(b.attempt("later")).release()  # the joint waiter left b: later is served
    places = refused_all(both.attempt("joint", hold_back=5.0))
    assert waiters(b) == {"joint": (places.ticket, "asking")}
    assert places.places[1].ticket == places.ticket
    refused(b.attempt("later", queue=False))  # b's permit is the joint waiter's turn
    hold_a.release()
    granted(both.attempt("joint")).release()


def test_a_waiter_holds_nothing_and_is_never_waiting_in_place(
    make_semaphore: MakeSemaphore, make_set: MakeSet
) -> None:
    a, b = make_semaphore(1), make_semaphore(2)
    both = make_set(a, b)
    hold_a = granted(a.attempt("ha"))
    got: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: got.update(joint=both.acquire(10, "joint")))
    thread.start()
    wait_for(lambda: "joint" in waiters(b), what="the joint waiter holding b's line back")
    time.sleep(0.2)
    assert holders(b) == set()
    assert waiters(a)["joint"][1] == waiters(b)["joint"][1] == "asking"
    single = threading.Thread(target=lambda: got.update(single=b.acquire(10, "single")))
    single.start()
    wait_for(lambda: "single" in holders(b), what="b's free permit behind the joint waiter")
    started = time.monotonic()
    hold_a.release()
    thread.join(10)
    single.join(10)
    assert time.monotonic() - started < 1.5, "woken by a's release (else it rechecks in 2 s)"
    assert [p.holder for p in granted(got["joint"])] == ["joint", "joint"]
    assert holders(a) == {"joint"} and holders(b) == {"joint", "single"}
    assert waiters(a) == waiters(b) == {}


def test_acquire_times_out_naming_the_refusing_semaphore_and_leaves_no_place(
    make_semaphore: MakeSemaphore, make_set: MakeSet
) -> None:
    a, b = make_semaphore(3), make_semaphore(1)
    both = make_set(a, b)
    granted(b.attempt("hb"))
    with pytest.raises(SemaphoreTimeout) as raised:
        both.acquire(0.3, "joint")
    assert raised.value.name == b.name
    assert waiters(a) == waiters(b) == {}
    assert holders(a) == set()


def test_threads_contending_for_two_semaphores_never_exceed_either_limit(
    make_semaphore: MakeSemaphore, make_set: MakeSet
) -> None:
    """Joint contenders and ones of a alone; an atomic snapshot of both holder sets
    never shows a limit passed, nor a joint holder on one semaphore without the other
    unless its release had begun (the permits of a set are released one by one)."""
    a, b = make_semaphore(2), make_semaphore(1)
    both = make_set(a, b)
    snapshot = "return {redis.call('ZRANGE', KEYS[1], 0, -1), redis.call('ZRANGE', KEYS[2], 0, -1)}"
    done = threading.Event()
    seen: list[tuple[float, set[str], set[str]]] = []
    served: list[str] = []
    releasing: dict[str, float] = {}

    def watch() -> None:
        with redis.Redis.from_url(a.url) as client:
            while not done.is_set():
                in_a, in_b = client.eval(snapshot, 2, a.keys.holders, b.keys.holders)
                after = time.monotonic()
                seen.append((after, {x.decode() for x in in_a}, {x.decode() for x in in_b}))
                time.sleep(0.002)

    def joint(index: int) -> None:
        for round_ in range(5):
            holder = f"joint-{index}-{round_}"
            permits = both.acquire(20, holder)
            time.sleep(0.01)
            releasing[holder] = time.monotonic()
            assert permits.release() is True
            served.append("joint")

    def alone(index: int) -> None:
        for round_ in range(5):
            with a.acquire(20, f"solo-{index}-{round_}"):
                time.sleep(0.01)
            served.append("solo")

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=joint, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=alone, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    done.set()
    watcher.join(5)
    assert served.count("joint") == 20 and served.count("solo") == 15, "everyone served"
    assert len(seen) > 20
    for after, in_a, in_b in seen:
        assert len(in_a) <= 2 and len(in_b) <= 1, (in_a, in_b)
        for alone_in_one in {h for h in in_a if h.startswith("joint")} ^ in_b:
            assert releasing.get(alone_in_one, after) < after, (alone_in_one, in_a, in_b)


def test_weights_per_semaphore(make_semaphore: MakeSemaphore, make_set: MakeSet) -> None:
    a, b = make_semaphore(3), make_semaphore(2)
    both = make_set(a, b)
    permits = granted(both.attempt("heavy", weights=[2, 1]))
    assert [p.weight for p in permits] == [2, 1]
    assert (a.status().holder_count, b.status().holder_count) == (2, 1)
    places = refused_all(both.attempt("next", weights=[2, 1]))
    assert places.refused_by == (0,), "a has one permit left; b would admit"
    assert b.status().holder_count == 1, "nothing taken on b"
    assert refused_all(both.attempt("light")).refused_by == (0,), "next is ahead of it in a"
    permits.release()
    granted(both.attempt("next", places.ticket, weights=[2, 1]))
    granted(both.attempt("light"))
    assert (a.status().holder_count, b.status().holder_count) == (3, 2)
    with pytest.raises(ValueError, match="weight"):
        both.attempt("too-heavy", weights=[4, 1])
    with pytest.raises(ValueError, match="weights must give one value per semaphore"):
        both.attempt("short", weights=[1])


def test_a_rate_and_a_limit_on_two_names_are_one_step(
    make_semaphore: MakeSemaphore, make_set: MakeSet
) -> None:
    paced = make_semaphore(None, rate=RateLimit(2, 1.0, burst=1))
    capped = make_semaphore(1)
    both = make_set(paced, capped)
    granted(both.attempt("first")).release()
    places = refused_all(both.attempt("second"))
    assert places.refused_by == (0,), "the rate refuses; the free permit of capped would admit"
    due = places.places[0].rate_due
    assert due is not None and 0 < due <= 0.5
    assert holders(capped) == set()
    started = time.monotonic()
    permits = both.acquire(5, "second")
    assert time.monotonic() - started >= due - 0.05
    assert holders(capped) == {"second"}
    permits.release()


def test_the_permit_set_is_renewed_and_released_together(
    make_semaphore: MakeSemaphore, make_set: MakeSet
) -> None:
    a = make_semaphore(1, lease_timeout=0.6)
    b = make_semaphore(1, lease_timeout=0.6)
    both = make_set(a, b)
    permits = granted(both.attempt("job"))
    assert permits[a.name].fencing_token > 0 and permits[b.name].semaphore.name == b.name
    for _ in range(3):
        time.sleep(0.3)
        assert permits.renew(0.6) is True
    assert holders(a) == holders(b) == {"job"}
    assert permits.release() is True
    assert permits.release() is False
    again = granted(both.attempt("again", lease_timeout=0.2))
    time.sleep(0.3)
    assert again.renew() is False, "lost on both"
    granted(both.attempt("by-id"))
    assert both.release("by-id") is True
    assert both.release("by-id") is False
    assert holders(a) == holders(b) == set()


def test_a_set_needs_one_redis_one_namespace_and_distinct_names(
    redis_session_server: RedisServer, redis_server: RedisServer
) -> None:
    url = redis_session_server.url
    a = Semaphore(url, f"a-{uuid.uuid4().hex}", 1)
    elsewhere = Semaphore(redis_server.url, "elsewhere", 1)
    other_namespace = Semaphore(url, "b", 1, namespace="other")
    same_name = Semaphore(url, a.name, 2)
    try:
        with pytest.raises(ValueError, match="share one Redis client"):
            SemaphoreSet([a, elsewhere])
        with pytest.raises(ValueError, match="share one namespace"):
            SemaphoreSet([a, other_namespace])
        with pytest.raises(ValueError, match="distinct names"):
            SemaphoreSet([a, same_name])
        with pytest.raises(ValueError, match="at least one"):
            SemaphoreSet([])
    finally:
        for sem in (a, elsewhere, other_namespace, same_name):
            sem.close()


def test_on_a_cluster_the_keys_must_be_in_one_slot(redis_cluster: RedisClusterServers) -> None:
    names = [f"n-{uuid.uuid4().hex}" for _ in range(2)]
    url = redis_cluster.url.replace("redis://", "redis+cluster://")
    sems = [Semaphore(url, name, 1) for name in names]
    try:
        with pytest.raises(ValueError, match="one Redis Cluster slot"):
            SemaphoreSet(sems)
        alone = SemaphoreSet([sems[0]])
        granted(alone.attempt("job")).release()
    finally:
        for sem in sems:
            sem.close()


def test_after_a_data_loss_the_set_waits_for_the_pause_on_every_semaphore(
    make_semaphore: MakeSemaphore, make_set: MakeSet, redis_server: RedisServer
) -> None:
    a = make_semaphore(1, url=redis_server.url, pause_after_loss=0.5)
    b = make_semaphore(1, url=redis_server.url, pause_after_loss=0.5)
    both = make_set(a, b)
    granted(both.attempt("before")).release()
    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()
    places = refused_all(both.attempt("after"))
    assert places.refused_by == (0, 1)
    assert all(p.resumes_in is not None and p.resumes_in <= 0.5 for p in places.places)
    assert holders(a) == holders(b) == set()
    time.sleep(0.6)
    granted(both.attempt("after", places.ticket)).release()


def test_every_joint_call_reads_each_semaphores_meta_at_most_once(
    make_semaphore: MakeSemaphore, make_set: MakeSet
) -> None:
    from test_lua_contract import Monitor

    a, b = make_semaphore(1), make_semaphore(2, lease_timeout=0.2)
    both = make_set(a, b)
    monitor = Monitor(a.url)
    monitor.start()
    assert monitor.ready.wait(5)
    time.sleep(0.1)
    granted(both.attempt("first"))  # b's lease runs out: reclaimed by a later call
    refused_all(both.attempt("second", hold_back=5.0))
    time.sleep(0.25)
    refused_all(both.attempt("second"))  # reclaims in b, leaves b's line
    assert both.release("first") is False, "its permit on b had lapsed"
    granted(both.attempt("second"))
    a.client.echo("end-of-test")
    monitor.join(5)
    for sem in (a, b):
        counts = monitor.meta_reads_per_call(sem.keys.meta)
        assert sum(counts.values()) >= 5
        assert set(counts) <= {0, 1}, (sem.name, counts)


def test_a_permit_it_holds_already_counts_as_admitted_and_is_left_as_it_is(
    make_semaphore: MakeSemaphore, make_set: MakeSet
) -> None:
    """A redelivered job that still holds one semaphore (its old execution's permit)
    while another refuses: the held permit stays, and nothing more is taken."""
    a, b = make_semaphore(1), make_semaphore(1)
    both = make_set(a, b)
    old = granted(a.attempt("job"))
    hold_b = granted(b.attempt("hb"))
    places = refused_all(both.attempt("job", hold_back=5.0))
    assert places.refused_by == (1,)
    assert holders(a) == {"job"} and waiters(a) == {}, "held, not in a's line"
    hold_b.release()
    permits = granted(both.attempt("job"))
    assert permits[a.name].fencing_token > old.fencing_token, "the same permit, a new token"
    assert permits.release() is True
    assert old.release() is False


def test_a_copy_handed_over_by_one_semaphore_is_served_once_and_a_stale_one_refused(
    make_semaphore: MakeSemaphore, make_set: MakeSet
) -> None:
    handed: list[Any] = []
    a, b = make_semaphore(2), make_semaphore(1, on_handover=handed.extend)
    pair = make_set(a, b)
    blocker = granted(b.attempt("blocker"))
    places = refused_all(pair.attempt("job"))
    assert places.refused_by == (1,)
    b.park("job", "payload", places.ticket)
    blocker.release()
    (handover,) = handed
    with pytest.raises(ValueError, match=r"handover must be \(index of a semaphore"):
        pair.attempt("job", handover=(2, handover.token))
    permits = pair.attempt("job", places.ticket, handover=(1, handover.token))
    assert holders(a) == {"job"} and holders(b) == {"job"}, f"granted on both: {permits!r}"
    assert b.status().waiter_count == 0
    with pytest.raises(StaleHandover):  # a copy of another handover than the last one
        pair.attempt("job", handover=(1, handover.token + 1))
    assert holders(a) == {"job"}, "a stale copy changes nothing"


def test_on_a_cluster_a_namespace_with_a_hash_tag_puts_a_set_on_one_slot(
    redis_cluster: RedisClusterServers,
) -> None:
    url = redis_cluster.url.replace("redis://", "redis+cluster://")
    namespace = f"cs{{{uuid.uuid4().hex[:8]}}}"
    a, b = (Semaphore(url, name, 1, namespace=namespace) for name in ("gpu", "licence"))
    try:
        pair = SemaphoreSet([a, b])
        blocker = granted(b.attempt("blocker"))
        places = refused_all(pair.attempt("job"))
        assert places.refused_by == (1,)
        assert holders(a) == set(), "nothing taken on the one that would admit it"
        blocker.release()
        permits = pair.attempt("job", places.ticket)
        assert holders(a) == {"job"} and holders(b) == {"job"}, repr(permits)
    finally:
        a.close()
        b.close()


def test_wait_for_turn_refuses_a_refusal_that_is_not_places(
    make_semaphore: MakeSemaphore, make_set: MakeSet
) -> None:
    both = make_set(make_semaphore(1), make_semaphore(1))
    with pytest.raises(TypeError, match="refused must be the Places that attempt"):
        both.wait_for_turn(0.1, "job", refused="place")
