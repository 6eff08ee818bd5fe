"""FIFO fairness of the semaphore against a real redis-server, sync and asyncio alike.

Contenders that queued in a known order are granted in exactly that order, whether
they poll with attempt() or block in acquire() in threads; a ticket presented again
after its place lapsed regains that place, ahead of everyone who queued after it.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from outcomes import granted, refused, script_calls, wait_for

from celery_semaphore import Permit, Place, Semaphore
from devkit.redis_servers import RedisServer

MakeSemaphore = Callable[..., Semaphore]


def waiter_ids(sem: Semaphore) -> list[str]:
    return [w.holder for w in sem.status().waiters]


def poll(sem: Semaphore, contenders: list[str]) -> list[Permit]:
    """One attempt per contender, in the given order; the permits granted."""
    return [r for r in (sem.attempt(c) for c in contenders) if not isinstance(r, Place)]


def test_polling_contenders_are_granted_in_the_order_they_queued(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(2)
    holders = [granted(sem.attempt(h)) for h in ("h1", "h2")]
    contenders = [f"c{i}" for i in range(6)]
    places = [refused(sem.attempt(c)) for c in contenders]
    assert [p.position for p in places] == [1, 2, 3, 4, 5, 6]
    tickets = [p.ticket for p in places]
    assert tickets == sorted(tickets)
    assert len(set(tickets)) == len(tickets)
    assert waiter_ids(sem) == contenders

    # Nothing is granted while the semaphore is full, however often they ask.
    assert poll(sem, contenders[::-1]) == []
    # Positions are stable under repeated asking.
    assert [refused(sem.attempt(c)).position for c in contenders] == [1, 2, 3, 4, 5, 6]

    order: list[str] = []
    active = list(holders)
    while len(order) < len(contenders):
        active.pop(0).release()
        # A newcomer that never queued is refused while others wait in line.
        newcomer = refused(sem.attempt(f"newcomer{len(order)}", queue=False))
        assert newcomer.position == len(contenders) - len(order) + 1
        # Ask in reverse order: only the earliest contender in line may win.
        won = poll(sem, [c for c in contenders[::-1] if c not in order])
        assert len(won) == 1, [p.holder for p in won]
        order.append(won[0].holder)
        active.append(won[0])
    assert order == contenders


def test_two_free_permits_go_to_the_first_two_in_line(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(2)
    a, b = granted(sem.attempt("a")), granted(sem.attempt("b"))
    for c in ("c1", "c2", "c3"):
        refused(sem.attempt(c))
    a.release()
    b.release()
    assert refused(sem.attempt("c3")).position == 3
    assert granted(sem.attempt("c2")).holder == "c2"
    assert granted(sem.attempt("c1")).holder == "c1"
    assert refused(sem.attempt("c3")).position == 1


def test_blocked_acquires_are_granted_in_the_order_they_queued(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(1, recheck_interval=0.5)
    first = granted(sem.attempt("first"))
    grants: list[tuple[int, str]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def contend(holder: str) -> None:
        try:
            permit = sem.acquire(timeout=20, holder=holder)
            with lock:
                grants.append((permit.fencing_token, holder))
            time.sleep(0.01)
            assert permit.release()
        except BaseException as exc:
            errors.append(exc)

    names = [f"t{i}" for i in range(8)]
    threads = []
    for i, holder in enumerate(names):
        thread = threading.Thread(target=contend, args=(holder,), daemon=True)
        thread.start()
        threads.append(thread)
        # Enqueue one at a time, so the order of the line is known.
        wait_for(lambda n=i + 1: len(waiter_ids(sem)) == n, what=f"{holder} to queue")
    assert waiter_ids(sem) == names
    first.release()
    for thread in threads:
        thread.join(20)
    assert not errors, errors
    assert [holder for _, holder in grants] == names
    # Fencing tokens are handed out at grant time: they confirm the grant order.
    assert [holder for _, holder in sorted(grants)] == names


def test_a_ticket_presented_after_its_place_lapsed_regains_it(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = make_semaphore(1)
    holder = granted(sem.attempt("holder"))
    place = refused(sem.attempt("early", wait_lease=0.2))
    refused(sem.attempt("late"))  # queued after "early", keeps its place for 20 s
    time.sleep(0.3)  # "early" stopped asking for longer than its waiter lease
    assert waiter_ids(sem) == ["late"]
    assert refused(sem.attempt("late")).position == 1

    again = refused(sem.attempt("early", ticket=place.ticket))
    assert again.position == 1
    assert again.ticket == place.ticket
    assert waiter_ids(sem) == ["early", "late"]
    assert refused(sem.attempt("late")).position == 2

    holder.release()
    refused(sem.attempt("late"))
    assert granted(sem.attempt("early")).holder == "early"


def test_a_ticket_presented_to_acquire_regains_its_place(make_semaphore: MakeSemaphore) -> None:
    sem = make_semaphore(1, recheck_interval=0.5)
    holder = granted(sem.attempt("holder"))
    place = refused(sem.attempt("early", wait_lease=0.2))
    time.sleep(0.3)
    refused(sem.attempt("late"))  # queued after "early" left, before it came back
    assert waiter_ids(sem) == ["late"]
    grants: list[str] = []

    def contend(name: str, ticket: int | None) -> None:
        permit = sem.acquire(timeout=20, holder=name, ticket=ticket)
        grants.append(name)
        permit.release()

    late = threading.Thread(target=contend, args=("late", None), daemon=True)
    early = threading.Thread(target=contend, args=("early", place.ticket), daemon=True)
    late.start()
    early.start()
    wait_for(lambda: waiter_ids(sem) == ["early", "late"], what="both to queue")
    holder.release()
    late.join(20)
    early.join(20)
    assert grants == ["early", "late"]


class Interrupted(Exception):
    pass


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs SIGALRM")
def test_an_interrupted_acquire_leaves_the_line(make_semaphore: MakeSemaphore) -> None:
    # Celery's soft time limit (and KeyboardInterrupt) arrive as an exception raised by
    # a signal handler in the middle of the blocked acquire(). Its place in line must go
    # with it: a ghost at the head of the line would keep the next permit from anyone
    # else for the whole waiter lease.
    sem = make_semaphore(1, waiter_lease=20)
    holder = granted(sem.attempt("holder"))
    previous = signal.signal(signal.SIGALRM, _interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(Interrupted):
            sem.acquire(timeout=10, holder="interrupted")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert waiter_ids(sem) == []
    holder.release()
    assert granted(sem.attempt("next")).holder == "next"


def script_calls_made(client: Any) -> int:
    return script_calls(client)[0]


def test_a_release_wakes_only_the_waiters_it_can_admit(redis_server: RedisServer) -> None:
    """A chain of N blocked waiters, each releasing as soon as it is granted, costs
    about 2 script calls per hand-off; if every release woke every waiter, each
    hand-off would cost one attempt per waiter still in line (about N * N / 2)."""
    client = redis_server.client()
    sem = Semaphore(client, "herd", 1, recheck_interval=30)
    holder = granted(sem.attempt("holder"))
    waiters = 10
    order: list[str] = []

    def wait_then_hand_on(name: str) -> None:
        with sem.acquire(timeout=20, holder=name):
            order.append(name)

    threads = []
    for i in range(waiters):
        threads.append(threading.Thread(target=wait_then_hand_on, args=(f"w{i}",)))
        threads[-1].start()
        wait_for(lambda i=i: sem.status().waiter_count == i + 1, what=f"w{i} in line")
    wait_for(lambda: client.pubsub_numsub(sem.keys.channel)[0][1] == waiters, what="subscribed")
    before = script_calls_made(client)
    holder.release()
    for thread in threads:
        thread.join(20)
    calls = script_calls_made(client) - before
    assert order == [f"w{i}" for i in range(waiters)]
    assert calls <= 3 * waiters + 1, calls
    client.close()


def test_any_exception_inside_the_wait_leaves_the_line(
    make_semaphore: MakeSemaphore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sync and asyncio alike (the asyncio semaphore used to leave only on cancellation)."""
    from celery_semaphore.core.redis._async.store import AsyncRedisStore
    from celery_semaphore.core.redis._sync.store import RedisStore

    async def broken_async_sleep(*args: Any) -> None:
        raise RuntimeError("boom")

    def broken_sleep(*args: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(AsyncRedisStore, "wait_for_wakeup", broken_async_sleep)
    monkeypatch.setattr(RedisStore, "wait_for_wakeup", broken_sleep)
    sem = make_semaphore(1, waiter_lease=20)
    holder = granted(sem.attempt("holder"))
    with pytest.raises(RuntimeError, match="boom"):
        sem.acquire(timeout=10, holder="broken")
    assert waiter_ids(sem) == []
    holder.release()
