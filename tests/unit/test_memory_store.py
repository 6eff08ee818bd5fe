"""The memory store (``memory://``) as a user's tests meet it: the public API, no server.

What it answers is the reference model's, compared with Redis's by tests/conformance;
here: that it is a store one can use (waiting, waking, asyncio, hand-overs, sharing by
URL) and says clearly what it is not for.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from celery_semaphore import AsyncSemaphore, Handover, Semaphore, SemaphoreSet, SemaphoreTimeout
from celery_semaphore.core import model
from celery_semaphore.core.memory import backend


def url() -> str:
    return f"memory://test-{uuid.uuid4().hex}"


def test_semaphores_of_one_url_share_their_state_and_another_url_is_another_store() -> None:
    where = url()
    first, again = Semaphore(where, "api", 1), Semaphore(where, "api", 1)
    elsewhere = Semaphore(url(), "api", 1)
    permit = first.acquire()
    assert again.try_acquire() is None
    assert elsewhere.try_acquire() is not None
    permit.release()
    assert again.try_acquire() is not None


def test_a_blocked_waiter_is_woken_by_a_release_in_another_thread() -> None:
    sem = Semaphore(url(), "api", 1, recheck_interval=30.0, waiter_lease=90.0)
    held = sem.acquire(holder="first")
    threading.Timer(0.2, held.release).start()
    started = time.monotonic()
    permit = sem.acquire(timeout=10, holder="second")
    waited = time.monotonic() - started
    assert permit.holder == "second"
    assert waited < 5.0, "woken by the release, not by the 30 s re-check"
    with pytest.raises(SemaphoreTimeout):
        sem.acquire(timeout=0.1, holder="third")
    assert [w.holder for w in sem.status().waiters] == []


def test_the_asyncio_semaphore_runs_on_it_in_fifo_order() -> None:
    async def main() -> list[str]:
        sem = AsyncSemaphore(url(), "api", 1)
        order: list[str] = []
        first = await sem.acquire(holder="first")

        async def worker(name: str) -> None:
            permit = await sem.acquire(timeout=10, holder=name)
            order.append(name)
            await permit.release()

        tasks = []
        for name in ("a", "b", "c"):
            tasks.append(asyncio.create_task(worker(name)))
            await asyncio.sleep(0.02)  # each takes its place in line in turn
        await first.release()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(main()) == ["a", "b", "c"]


def test_a_parked_waiter_is_handed_over_when_a_permit_frees() -> None:
    handed: list[Handover] = []
    sem = Semaphore(url(), "api", 1, on_handover=handed.extend)
    held = sem.acquire(holder="holder")
    place = sem.attempt("waiter")
    assert not isinstance(place, type(held))
    sem.park("waiter", "the message", place.ticket)
    assert handed == []
    held.release()
    assert [(h.holder, h.payload) for h in handed] == [("waiter", "the message")]
    permit = sem.attempt("waiter", handover=handed[0].token)
    assert permit.holder == "waiter"  # type: ignore[union-attr]


def test_a_set_takes_all_its_semaphores_or_none() -> None:
    where = url()
    a, b = Semaphore(where, "a", 1), Semaphore(where, "b", 2)
    both = SemaphoreSet([a, b])
    held = b.acquire(holder="other", weight=2)
    refused = both.attempt("both")
    assert not hasattr(refused, "permits") and refused.refused_by == (1,)  # type: ignore[union-attr]
    assert a.status().holder_count == 0, "nothing taken where it would have been admitted"
    held.release()
    permits = both.acquire(timeout=10, holder="both")
    assert [p.semaphore.name for p in permits.permits] == ["a", "b"]
    with pytest.raises(ValueError, match="distinct names"):
        SemaphoreSet([a, Semaphore(where, "a", 1)])


def test_a_waiter_in_place_is_granted_its_permit_by_the_release() -> None:
    """As on Redis: the release grants the permit straight to the waiter in place (a
    wake message naming it), so nobody else can take it between."""
    sem = Semaphore(url(), "api", 1, recheck_interval=30.0)
    held = sem.acquire(holder="first")
    granted: list[object] = []
    waiter = threading.Thread(target=lambda: granted.append(sem.acquire(timeout=10, holder="w")))
    waiter.start()
    deadline = time.monotonic() + 5
    while not any(w.state == "waiting in place" for w in sem.status().waiters):
        assert time.monotonic() < deadline, "the waiter never waited in place"
        time.sleep(0.01)
    held.release()
    assert sem.try_acquire(holder="late") is None, "the permit went to the waiter in place"
    waiter.join(5)
    assert [p.holder for p in granted] == ["w"]  # type: ignore[attr-defined]


def test_a_semaphore_idle_past_its_idle_ttl_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    """As Redis lets an idle semaphore's keys expire: a key function's semaphores do not
    pile up in the memory store."""
    monkeypatch.setattr(backend.Backend, "SWEEP_EVERY", 0.0)
    where = url()
    short = dict(lease_timeout=0.05, waiter_lease=0.05, idle_ttl=0.05)
    for key in range(50):
        Semaphore(where, f"customer-{key}", 1, **short).try_acquire(holder="h")
    kept = backend.backend_for(where)
    assert len(kept.models) == 50
    time.sleep(0.15)
    Semaphore(where, "other", 1).status()
    assert set(kept.models) == {("celery_semaphore", "other")}


def test_a_waiter_whose_messages_were_dropped_asks_again() -> None:
    """Each semaphore keeps its last messages only; a waiter that fell behind them is
    woken (it asks again) instead of missing a grant meant for it."""
    messages = backend.Messages()
    key, other = ("ns", "busy"), ("ns", "quiet")
    messages.publish(other, [model.WakeUp(7)])
    for ticket in range(3 * backend.Messages.KEPT):
        messages.publish(key, [model.WakeUp(ticket)])
    assert len(messages.kept[key]) <= 2 * backend.Messages.KEPT
    behind = messages.since(1, frozenset({key}))
    assert behind[0][1] == model.WakeUp(None), "it fell behind: woken"
    latest = messages.since(messages.last - 1, frozenset({key, other}))
    assert [m for _, m in latest] == [model.WakeUp(3 * backend.Messages.KEPT - 1)]
    assert [m for _, m in messages.since(0, frozenset({other}))] == [model.WakeUp(7)]


def test_what_it_is_not_for_is_said_in_one_line() -> None:
    with pytest.raises(TypeError, match=r"url= is only for a redis-py client passed in"):
        Semaphore("memory://", "api", 1, url="redis://elsewhere")


def test_a_prefork_worker_on_the_memory_store_refuses_to_start() -> None:
    """Its children would each have a store of their own: no cap across them."""
    from types import SimpleNamespace

    from celery.concurrency.prefork import TaskPool as Prefork
    from celery.concurrency.thread import TaskPool as Threads

    from celery_semaphore.worker.bootstep import check_one_process

    with pytest.raises(ValueError, match=r"--pool threads \(or solo\), or give a redis:// URL"):
        check_one_process(SimpleNamespace(pool_cls=Prefork), "memory://")
    check_one_process(SimpleNamespace(pool_cls=Threads), "memory://")
    check_one_process(SimpleNamespace(pool_cls=Prefork), "redis://localhost/0")
