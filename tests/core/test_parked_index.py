"""The index of the semaphores with parked waiters (``<namespace>:parked-index``):
whoever parks lists the semaphore there, the worker heartbeat reads it instead of
SCANning the keyspace, and a name leaves it only when its parked waiters are gone
and nobody listed it again for a while. Sync and asyncio semaphores alike."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from outcomes import granted, refused

from celery_semaphore.core.redis import parked_index
from celery_semaphore.core.redis.discovery import index_parked
from celery_semaphore.core.results import Handover

MakeSemaphore = Callable[..., Any]


def parking_semaphore(make_semaphore: MakeSemaphore, handed: list[Handover]) -> Any:
    """A full semaphore (one holder) in a namespace of its own, handing over to ``handed``."""
    namespace = f"index-{uuid.uuid4().hex}"
    sem = make_semaphore(1, on_handover=handed.extend, namespace=namespace)
    granted(sem.attempt("holder"))
    return sem


def park(sem: Any, holder: str) -> None:
    sem.park(holder, f"payload-{holder}", refused(sem.attempt(holder)).ticket)


def namespace_of(sem: Any) -> str:
    return str(sem.keys.meta.split(":{")[0])


def listed(sem: Any) -> dict[str, int]:
    """The index as the heartbeat reads it: name -> score (ms of server time)."""
    _now, entries = parked_index.read(sem.client, namespace_of(sem))
    return dict(entries)


def test_parking_lists_the_semaphore_with_the_server_time_once_per_interval(
    make_semaphore: MakeSemaphore, monkeypatch: pytest.MonkeyPatch
) -> None:
    sem = parking_semaphore(make_semaphore, [])
    assert listed(sem) == {}
    park(sem, "a")
    first = listed(sem)[sem.name]
    server_ms = sem.client.time()
    assert abs(server_ms[0] * 1000 + server_ms[1] // 1000 - first) < 5000
    time.sleep(0.01)
    park(sem, "b")
    assert listed(sem) == {sem.name: first}, "listed again within REGISTER_EVERY"
    monkeypatch.setattr(parked_index, "REGISTER_EVERY", 0.0)
    park(sem, "c")
    assert listed(sem)[sem.name] > first


def test_a_name_leaves_the_index_once_its_parked_waiters_are_gone_and_it_aged(
    make_semaphore: MakeSemaphore, monkeypatch: pytest.MonkeyPatch
) -> None:
    sem = parking_semaphore(make_semaphore, [])
    namespace = namespace_of(sem)
    park(sem, "a")
    now_ms, entries = parked_index.read(sem.client, namespace)
    assert parked_index.forget_idle(sem.client, namespace, now_ms, entries) == []  # young

    monkeypatch.setattr(parked_index, "FORGET_AFTER", 0.05)
    time.sleep(0.1)
    now_ms, entries = parked_index.read(sem.client, namespace)
    assert parked_index.forget_idle(sem.client, namespace, now_ms, entries) == []  # parked
    assert sem.release("a") is False  # the parked waiter leaves the line
    assert sem.client.hlen(sem.keys.parked) == 0
    assert parked_index.forget_idle(sem.client, namespace, now_ms, entries) == [sem.name]
    assert listed(sem) == {}
    assert not sem.client.exists(parked_index.index_key(namespace))


@pytest.mark.parametrize("register_every", [0.05, 10.0])
def test_a_park_racing_the_removal_keeps_the_name_listed(
    make_semaphore: MakeSemaphore, monkeypatch: pytest.MonkeyPatch, register_every: float
) -> None:
    """The park lands between the heartbeat's look at the parked hash (empty) and its
    removal. It listed the name again first (its last listing is older than
    REGISTER_EVERY, since the name is older than FORGET_AFTER), so the removal,
    which compares the score it read, leaves it. With a REGISTER_EVERY longer
    than FORGET_AFTER (not what the package ships) the name would be lost."""
    assert parked_index.REGISTER_EVERY * 2 < parked_index.FORGET_AFTER
    monkeypatch.setattr(parked_index, "REGISTER_EVERY", register_every)
    monkeypatch.setattr(parked_index, "FORGET_AFTER", 0.1)
    handed: list[Handover] = []
    sem = parking_semaphore(make_semaphore, handed)
    namespace = namespace_of(sem)
    park(sem, "early")
    assert sem.release("early") is False
    time.sleep(0.2)

    hlen = sem.client.hlen

    def hlen_then_a_park(key: str) -> int:
        length = hlen(key)
        park(sem, "racer")
        return length

    monkeypatch.setattr(sem.client, "hlen", hlen_then_a_park)
    now_ms, entries = parked_index.read(sem.client, namespace)
    forgotten = parked_index.forget_idle(sem.client, namespace, now_ms, entries)
    monkeypatch.undo()
    assert sem.client.hlen(sem.keys.parked) == 1  # racer is parked
    if register_every < 0.1:
        assert forgotten == [] and sem.name in listed(sem)
        sem.release("holder")  # racer is handed over (release is the dispatch here)
        assert [h.holder for h in handed] == ["racer"]
    else:
        assert forgotten == [sem.name] and listed(sem) == {}


def test_names_parked_before_the_index_are_listed_by_one_scan_per_client(
    make_semaphore: MakeSemaphore,
) -> None:
    sem = parking_semaphore(make_semaphore, [])
    namespace = namespace_of(sem)
    park(sem, "a")
    sem.client.delete(parked_index.index_key(namespace))  # parked with 0.1.0, say

    assert index_parked(sem.client, namespace) == [sem.name]
    assert sem.name in listed(sem)
    sem.client.delete(parked_index.index_key(namespace))
    assert index_parked(sem.client, namespace) == [], "scanned again"


def test_the_listing_times_a_process_keeps_are_pruned(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(parked_index, "clock", lambda: now[0])
    monkeypatch.setattr(parked_index, "PRUNE_ABOVE", 10)
    listings = parked_index.Listings()
    for i in range(25):  # all recent: kept, pruned only now and then
        listings.done("ns", f"n{i}", now[0])
    assert not any(listings.due("ns", f"n{i}") for i in range(25))
    now[0] += parked_index.REGISTER_EVERY
    for i in range(100):
        listings.done("ns", f"m{i}", now[0])
    assert {name[0] for _ns, name in listings._at} == {"m"}  # the old ones went
    assert listings.due("ns", "n0") and not listings.due("ns", "m0")
