"""Parked waiters and their hand-over, in the semaphore core (sync and asyncio alike).

A parked waiter leaves a payload and stops asking; whichever call of a
publishing client makes it due hands it over (``on_handover``); it comes back
presenting the handover token, and a copy arriving after another took the place is refused as stale.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from outcomes import granted, refused

from celery_semaphore import Handover, SemaphoreKeyTypeError, StaleHandover
from celery_semaphore.core.protocol import DEFAULT_NAMESPACE
from celery_semaphore.core.redis.keys import semaphore_keys
from celery_semaphore.publish import turn_is_near
from devkit.redis_servers import RedisClusterServers

MakeSemaphore = Callable[..., Any]


class Outbox:
    """What on_handover was given, in order."""

    def __init__(self) -> None:
        self.handovers: list[Handover] = []

    def __call__(self, handovers: list[Handover]) -> None:
        self.handovers.extend(handovers)

    def take(self) -> dict[str, Handover]:
        taken, self.handovers = self.handovers, []
        return {h.holder: h for h in taken}


@pytest.fixture
def outbox() -> Outbox:
    return Outbox()


def states(sem: Any) -> dict[str, str]:
    return {w.holder: w.state for w in sem.status().waiters}


def test_a_parked_waiter_is_handed_over_when_a_permit_frees_and_comes_back_with_its_token(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    sem = make_semaphore(1, on_handover=outbox)
    holder = granted(sem.attempt("holder"))
    place = refused(sem.attempt("a"))
    parked = sem.park("a", "payload-a", place.ticket)
    assert (parked.ticket, parked.position) == (place.ticket, 1)
    assert outbox.take() == {}
    assert states(sem) == {"a": "parked"}

    holder.release()
    handed = outbox.take()
    assert list(handed) == ["a"]
    assert handed["a"].payload == "payload-a"
    assert states(sem) == {"a": "handed over"}

    permit = granted(sem.attempt("a", handover=handed["a"].token))
    assert sem.status().waiter_count == 0
    permit.release()
    assert outbox.take() == {}, "handed over twice"


def test_parking_while_a_permit_is_free_hands_the_waiter_over_at_once(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    sem = make_semaphore(1, on_handover=outbox)
    holder = granted(sem.attempt("holder"))
    place = refused(sem.attempt("a"))
    holder.release()  # freed between the refusal and the park: nobody is parked yet
    assert outbox.take() == {}
    sem.park("a", "payload-a", place.ticket)
    assert list(outbox.take()) == ["a"]


def test_a_release_hands_over_the_next_one_and_the_window_behind_it_in_line_order(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    sem = make_semaphore(1, on_handover=outbox)
    holder = granted(sem.attempt("holder"))
    for name in ("a", "b", "c"):
        sem.park(name, f"payload-{name}", refused(sem.attempt(name)).ticket)
    assert outbox.take() == {}, "nothing is due while the permit is held"
    holder.release()
    # "a" gets the free permit; "b" is in the window (the limit, with no hold
    # estimate yet) and parked before this release; "c" stays parked.
    assert list(outbox.take()) == ["a", "b"]
    assert states(sem) == {"a": "handed over", "b": "handed over", "c": "parked"}


def test_a_waiter_that_parks_again_inside_the_window_is_not_handed_over_until_a_release(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    sem = make_semaphore(2, on_handover=outbox)
    held = [granted(sem.attempt(h)) for h in ("h1", "h2")]
    sem.park("a", "payload-a", refused(sem.attempt("a")).ticket)
    assert outbox.take() == {}, "in the window, but it parked after the last release"
    held[0].release()
    assert list(outbox.take()) == ["a"]


def test_a_waiter_handed_over_again_after_its_deadline_takes_the_first_copy_to_arrive(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    """Handed over again after its deadline, the first copy may only be late (and, moved
    out of a parking queue, it is the only one): whichever copy arrives first takes the
    place, and the other is stale after it."""
    sem = make_semaphore(1, on_handover=outbox, handover_deadline=0.2)
    holder = granted(sem.attempt("holder"))
    sem.park("a", "payload-a", refused(sem.attempt("a")).ticket)
    holder.release()
    first = outbox.take()["a"]
    assert sem.dispatch() == 0, "handed over again before its deadline"
    time.sleep(0.3)
    assert sem.dispatch() == 1
    second = outbox.take()["a"]
    assert second.token > first.token
    assert second.payload == "payload-a"
    permit = granted(sem.attempt("a", handover=first.token))
    with pytest.raises(StaleHandover) as info:
        sem.attempt("a", handover=second.token)
    assert info.value.token == first.token
    permit.release()
    with pytest.raises(StaleHandover):
        sem.attempt("a", handover=second.token)


def test_the_same_copy_delivered_again_proceeds_as_usual(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    """A redelivery of the copy that arrived (acks_late, a lost worker) is not a duplicate."""
    sem = make_semaphore(1, on_handover=outbox)
    holder = granted(sem.attempt("holder"))
    sem.park("a", "payload-a", refused(sem.attempt("a")).ticket)
    holder.release()
    token = outbox.take()["a"].token
    first = granted(sem.attempt("a", handover=token))
    again = granted(sem.attempt("a", handover=token))  # re-entrant: same slot
    assert again.fencing_token > first.fencing_token
    assert sem.status().holder_count == 1


def test_a_waiter_served_in_person_makes_its_handed_over_copy_stale(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    sem = make_semaphore(1, on_handover=outbox)
    holder = granted(sem.attempt("holder"))
    sem.park("a", "payload-a", refused(sem.attempt("a")).ticket)
    holder.release()
    token = outbox.take()["a"].token
    granted(sem.attempt("a")).release()  # came back on its own (another copy of the task)
    with pytest.raises(StaleHandover):
        sem.attempt("a", handover=token)


def test_asking_in_person_unparks(make_semaphore: MakeSemaphore, outbox: Outbox) -> None:
    sem = make_semaphore(1, on_handover=outbox)
    holder = granted(sem.attempt("holder"))
    place = refused(sem.attempt("a"))
    sem.park("a", "payload-a", place.ticket)
    assert refused(sem.attempt("a")).ticket == place.ticket  # keeps its place
    assert states(sem) == {"a": "asking"}
    holder.release()
    assert outbox.take() == {}, "a waiter asking in person was handed over too"


def test_leaving_the_line_drops_the_payload(make_semaphore: MakeSemaphore, outbox: Outbox) -> None:
    """What a revoke of a parked task does (release by id): never handed over."""
    sem = make_semaphore(1, on_handover=outbox)
    holder = granted(sem.attempt("holder"))
    sem.park("a", "payload-a", refused(sem.attempt("a")).ticket)
    assert sem.release("a") is False
    holder.release()
    assert outbox.take() == {}
    assert sem.status().waiter_count == 0


def test_draining_hands_nobody_over_and_resuming_does(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    sem = make_semaphore(1, on_handover=outbox)
    holder = granted(sem.attempt("holder"))
    sem.park("a", "payload-a", refused(sem.attempt("a")).ticket)
    sem.set_draining(True)
    holder.release()
    assert outbox.take() == {}
    sem.set_draining(False)
    assert list(outbox.take()) == ["a"]


def test_raising_the_limit_hands_over_at_once(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    sem = make_semaphore(1, on_handover=outbox)
    granted(sem.attempt("holder"))
    sem.park("a", "payload-a", refused(sem.attempt("a")).ticket)
    sem.set_limit(2)
    assert list(outbox.take()) == ["a"]


def test_a_lease_that_runs_out_while_nobody_calls_is_noticed_by_dispatch(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    sem = make_semaphore(1, on_handover=outbox, lease_timeout=0.2)
    granted(sem.attempt("holder"))  # never released: its owner died
    sem.park("a", "payload-a", refused(sem.attempt("a")).ticket)
    time.sleep(0.3)
    assert outbox.take() == {}
    assert sem.dispatch() == 1
    assert list(outbox.take()) == ["a"]


def test_a_client_without_on_handover_hands_nobody_over(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    parking = make_semaphore(1, on_handover=outbox)
    plain = make_semaphore(1, name=parking.name)
    holder = granted(plain.attempt("holder"))
    parking.park("a", "payload-a", refused(parking.attempt("a")).ticket)
    holder.release()  # by a client that does not publish
    assert outbox.take() == {}
    assert parking.dispatch() == 1
    with pytest.raises(ValueError, match="on_handover"):
        plain.park("b", "payload-b")
    with pytest.raises(ValueError, match="on_handover"):
        plain.dispatch()


def test_parked_keys_expire_when_idle(make_semaphore: MakeSemaphore, outbox: Outbox) -> None:
    sem = make_semaphore(1, on_handover=outbox, lease_timeout=0.1, waiter_lease=0.1, idle_ttl=0.4)
    granted(sem.attempt("holder"))
    sem.park("a", "payload-a", refused(sem.attempt("a")).ticket, park_lease=0.2)
    client = sem.client
    assert 0 < client.pttl(sem.keys.parked) <= 400
    time.sleep(0.7)
    assert client.exists(*sem.keys.script_keys) == 0, "idle keys must expire"


@pytest.mark.parametrize("role", ["parked", "handed"])
def test_a_parking_key_of_the_wrong_type_is_named(
    make_semaphore: MakeSemaphore, outbox: Outbox, role: str
) -> None:
    sem = make_semaphore(1, on_handover=outbox)
    granted(sem.attempt("holder"))
    place = refused(sem.attempt("a"))
    key = getattr(sem.keys, role)
    sem.client.set(key, "not mine")
    with pytest.raises(SemaphoreKeyTypeError) as info:
        sem.park("a", "payload-a", place.ticket)
    assert info.value.key == key


def test_bad_parking_arguments_are_refused(make_semaphore: MakeSemaphore, outbox: Outbox) -> None:
    sem = make_semaphore(1, on_handover=outbox)
    with pytest.raises(TypeError, match="payload"):
        sem.park("a", b"bytes")
    with pytest.raises(ValueError, match="park_lease"):
        sem.park("a", "p", park_lease=0)
    with pytest.raises(ValueError, match="handover"):
        sem.attempt("a", handover=0)
    with pytest.raises(TypeError, match="on_handover"):
        make_semaphore(1, on_handover="not callable")


def test_dispatch_drops_named_parked_waiters_and_leaves_the_others(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    """What the heartbeat does for revoked tasks: a parked one leaves the line and is
    never handed over; one asking in person or holding a permit is left alone."""
    sem = make_semaphore(1, on_handover=outbox)
    holder = granted(sem.attempt("holder"))
    sem.park("a", "payload-a", refused(sem.attempt("a")).ticket)
    refused(sem.attempt("b"))
    sem.dispatch(drop=["a", "b", "holder", "unknown"])
    assert [w.holder for w in sem.status().waiters] == ["b"]
    assert [h.holder for h in sem.status().holders] == ["holder"]
    holder.release()
    assert outbox.take() == {}


def test_a_parked_waiter_with_a_due_time_is_handed_over_then_even_if_its_turn_has_not_come(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    """A task whose wait budget runs out comes back to fail with SemaphoreTimeout."""
    sem = make_semaphore(1, on_handover=outbox)
    granted(sem.attempt("holder"))
    sem.park("a", "payload-a", refused(sem.attempt("a")).ticket, due=0.2)
    sem.park("b", "payload-b", refused(sem.attempt("b")).ticket)
    assert sem.dispatch() == 0
    time.sleep(0.3)
    assert sem.dispatch() == 1
    assert list(outbox.take()) == ["a"]


def place_or_park(sem: Any, holder: str, **kw: Any) -> tuple[Any, bool]:
    """take_place_or_park() as a publisher calls it, the payload naming the ticket."""
    return sem.take_place_or_park(holder, (f"<{holder}:", ">"), window=1.0, **kw)


def test_one_call_takes_a_place_and_parks_it_where_its_turn_is_far(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    """Limit 2, both permits held: the next two places are near (free permits plus one
    round of the limit) and only take their place, counted as sent; those after them
    park, their payload naming their ticket, and are no longer counted as sent."""
    sem = make_semaphore(2, on_handover=outbox)
    held = [granted(sem.attempt(h)) for h in ("h1", "h2")]
    placed = {name: place_or_park(sem, name, wait_lease=30) for name in "abcde"}
    tickets = [placed[name][0].ticket for name in "abcde"]
    assert tickets == sorted(set(tickets)), "tickets strictly increase in call order"
    assert [placed[name][0].position for name in "abcde"] == [1, 2, 3, 4, 5]
    assert [placed[name][1] for name in "abcde"] == [False, False, True, True, True]
    assert states(sem) == {"a": "asking", "b": "asking", "c": "parked", "d": "parked",
                           "e": "parked"}  # fmt: skip
    status = sem.status()
    assert (status.sent_count, status.parked_count) == (2, 3)
    assert outbox.take() == {}, "nothing is due while the permits are held"

    for holder in ("a", "b", "h1", "h2"):
        sem.release(holder)
    handed = outbox.take()
    assert list(handed) == ["c", "d", "e"]  # two free permits, and the window behind them
    for name, ticket in zip("cde", tickets[2:], strict=True):
        assert handed[name].payload == f"<{name}:{ticket}>"
    del held


def test_one_call_leaves_the_line_as_taking_a_place_then_parking_does(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    """The same waiters, weights, fair keys and priorities, taken in one call on one
    semaphore and in two (take_place(), then park() where far) on another: the same
    order, states, records and counts (tickets aside, which are times)."""
    asks = [
        ("a", {}), ("b", {"weight": 2}), ("c", {"fair_key": "x"}), ("d", {"fair_key": "y"}),
        ("e", {"priority": 5}), ("f", {"fair_key": "x", "priority": 3}), ("g", {}),
    ]  # fmt: skip
    one, two = make_semaphore(3, on_handover=outbox), make_semaphore(3, on_handover=outbox)
    for sem in (one, two):
        granted(sem.attempt("h1", weight=3))
    for name, kw in asks:
        place, parked = place_or_park(one, name, wait_lease=30, due=600, info=f"i-{name}", **kw)
        other = two.take_place(name, wait_lease=30, info=f"i-{name}", **kw)
        far = not turn_is_near(other, 1.0)
        if far:
            two.park(name, f"<{name}:{other.ticket}>", other.ticket, info=f"i-{name}", due=600)
        assert (parked, place.position) == (far, other.position), name

    def seen(sem: Any) -> tuple[Any, ...]:
        status = sem.status()
        waiters = [(w.holder, w.position, w.state, w.info, w.fair_key) for w in status.waiters]
        records = {
            holder.decode(): record.decode().split("|")[:3]
            for holder, record in sem.client.hgetall(sem.keys.parked).items()
        }
        return (waiters, records, status.sent_count, status.parked_count,
                sem.client.zcard(sem.keys.handed))  # fmt: skip

    assert seen(one) == seen(two)
    assert outbox.take() == {}


@pytest.mark.parametrize(
    "setup", ["free permits", "draining", "rate", "shadow limit", "shadow rate", "shadow both"]
)
def test_one_call_decides_near_and_far_as_turn_is_near_does(
    make_semaphore: MakeSemaphore, outbox: Outbox, setup: str
) -> None:
    """The script's decision is the one the publisher makes from a place
    (publish.turn_is_near()): free permits count, a draining line parks everyone,
    under a rate a slot beyond the window parks, and a shadow limit counts for
    nothing (it refuses nobody, so nobody is far behind it)."""
    rate = "2/s" if setup in ("rate", "shadow rate", "shadow both") else None
    shadow = {"shadow limit": ["limit"], "shadow rate": ["rate"], "shadow both": ["limit", "rate"]}
    sem = make_semaphore(3, on_handover=outbox, rate=rate, shadow=shadow.get(setup, []))
    granted(sem.attempt("h1"))
    if setup == "draining":
        sem.set_draining(True)
    decisions = []
    for i in range(9):
        place, parked = place_or_park(sem, f"w{i}", wait_lease=30)
        assert parked is not turn_is_near(place, 1.0), (i, place)
        decisions.append(parked)
    if setup in ("free permits", "shadow rate"):
        assert decisions == [False] * 5 + [True] * 4  # 2 free + one round of 3
    elif setup == "draining":
        assert decisions == [True] * 9
    elif setup == "rate":
        assert True in decisions
    else:
        assert decisions == [False] * 9, "nothing binds"


def test_a_shadow_limit_holds_back_no_parked_waiter(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    """A parked waiter is due at once where only a shadow limit is full, and a release
    hands over every parked waiter behind it; under an enforced limit, none and one."""
    for shadow in (["limit"], []):
        sem = make_semaphore(1, on_handover=outbox, shadow=shadow)
        holder = granted(sem.attempt("holder"))
        for name in ("a", "b", "c"):
            sem.park(name, f"payload-{name}")
        due = list(outbox.take())
        assert due == (["a", "b", "c"] if shadow else []), shadow
        holder.release()
        assert list(outbox.take()) == ([] if shadow else ["a", "b"]), shadow


def test_a_shadow_rate_holds_back_no_parked_waiter(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    """Under a rate of one a minute, parked waiters wait for their slots (the next one
    is handed over with its delay, the rest stay parked); under the same rate as a
    shadow one, all of them are due at once."""
    for shadow in (["rate"], []):
        sem = make_semaphore(10, on_handover=outbox, rate="1/m", shadow=shadow)
        granted(sem.attempt("holder"))  # spends the burst
        for name in ("a", "b", "c"):
            sem.park(name, f"payload-{name}")
        due = {name: h.delay for name, h in outbox.take().items()}
        if shadow:
            assert due == {"a": 0.0, "b": 0.0, "c": 0.0}
        else:
            assert set(due) <= {"a"} and all(d > 0 for d in due.values()), due


def test_a_waiter_behind_a_full_shadow_limit_is_woken_when_admissions_resume(
    make_semaphore: MakeSemaphore,
) -> None:
    """A drain refuses even what a shadow limit would let through. When it ends, a
    blocked waiter is woken though the shadow limit is full (it then asks and is
    granted, counted as a grant the shadow limit would have refused); it does not
    sleep until its next recheck."""
    sem = make_semaphore(1, shadow=["limit"], recheck_interval=60.0, waiter_lease=180.0)
    granted(sem.attempt("holder"))
    sem.set_draining(True)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(sem.acquire(timeout=30, holder="a")))
    waiter.start()
    deadline = time.monotonic() + 10
    while states(sem) != {"a": "waiting in place"} and time.monotonic() < deadline:
        time.sleep(0.01)
    assert states(sem) == {"a": "waiting in place"}, "blocked, subscribed to the wake-ups"
    sem.set_draining(False)
    waiter.join(timeout=10)
    assert not waiter.is_alive(), "not woken: it would have slept until its recheck"
    assert got and got[0].shadow_refused == {"limit"}


def test_the_parking_metrics_count_what_happened_and_nothing_else(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    from prometheus_client.core import Metric

    from celery_semaphore.metrics import SemaphoreCollector

    namespace = f"metrics-{uuid.uuid4().hex}"  # the collector reads every semaphore there
    sem = make_semaphore(1, on_handover=outbox, handover_deadline=0.2, namespace=namespace)

    def values() -> dict[str, float]:
        collector = SemaphoreCollector(sem.client, namespace)
        out: dict[str, float] = {}
        for family in collector.collect():
            assert isinstance(family, Metric)
            for sample in family.samples:
                if sample.labels.get("semaphore") == sem.name:
                    out[sample.name] = sample.value
        return out

    holder = granted(sem.attempt("holder"))
    refused(sem.attempt("asking"))  # waits without parking: counted nowhere below
    sem.park("a", "payload-a", refused(sem.attempt("a")).ticket)
    seen = values()
    assert seen["celery_semaphore_parked"] == 1
    assert seen["celery_semaphore_handed_over"] == 0
    assert seen["celery_semaphore_parks_total"] == 1
    assert seen["celery_semaphore_handovers_total"] == 0
    sem.release("asking")
    holder.release()  # hands "a" over
    seen = values()
    assert (seen["celery_semaphore_parked"], seen["celery_semaphore_handed_over"]) == (0, 1)
    assert seen["celery_semaphore_handovers_total"] == 1
    assert seen["celery_semaphore_handover_retries_total"] == 0
    time.sleep(0.3)
    sem.dispatch()  # past the deadline: handed over again
    seen = values()
    assert seen["celery_semaphore_handovers_total"] == 2
    assert seen["celery_semaphore_handover_retries_total"] == 1
    granted(sem.attempt("a", handover=outbox.take()["a"].token))
    seen = values()
    assert (seen["celery_semaphore_parked"], seen["celery_semaphore_handed_over"]) == (0, 0)


def test_the_parked_and_handed_over_counts_match_the_records_through_every_transition(
    make_semaphore: MakeSemaphore, outbox: Outbox, redis_session_server: Any
) -> None:
    """status() reads counts the scripts keep (O(1)); they must agree with a scan of
    the parked records after each kind of change: park, hand over, arrive, a stale
    copy, served in person, waiting in place, leaving the line, a lapsed place, a
    re-hand-over after the deadline, dispatch dropping waiters."""
    name = f"counts-{uuid.uuid4().hex}"
    sem = make_semaphore(1, name=name, on_handover=outbox, handover_deadline=0.2)
    raw = redis.Redis.from_url(redis_session_server.url)
    key = semaphore_keys(DEFAULT_NAMESPACE, name).parked

    def check() -> None:
        scanned = [v.decode().split("|")[1] for v in raw.hvals(key)]
        status = sem.status()
        assert (status.parked_count, status.handed_over_count) == (
            scanned.count("p"),
            scanned.count("h"),
        ), scanned

    holder = granted(sem.attempt("holder"))
    for name in ("a", "b", "c", "d"):
        sem.park(name, f"payload-{name}", refused(sem.attempt(name)).ticket)
    check()
    sem.park("a", "payload-a-again")  # parked again: still one
    check()
    holder.release()  # hands over a (free) and b, c, d (the window)
    handed = outbox.take()
    check()
    arrived = granted(sem.attempt("a", handover=handed["a"].token))
    check()
    with pytest.raises(StaleHandover):
        sem.attempt("a", handover=handed["a"].token + 1)
    check()
    arrived.release()
    check()
    granted(sem.attempt("b")).release()  # served in person while handed over
    check()
    sem.release("c")  # leaves the line
    check()
    time.sleep(0.35)
    sem.dispatch()  # d (and b) handed over again after the deadline
    check()
    sem.dispatch(drop=["d"])
    check()
    granted(sem.attempt("holder"))
    sem.park("e", "payload-e", refused(sem.attempt("e")).ticket, park_lease=0.05)
    check()
    time.sleep(0.1)
    sem.dispatch()  # e's place lapsed
    check()
    raw.close()


def keys_on_slot(node: redis.Redis, slot: int, keys: list[str]) -> set[str]:
    """Which of ``keys`` exist on ``node``, having checked they are all its keys in ``slot``."""
    present = {key for key in keys if node.exists(key)}
    assert node.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == len(present)
    return present


def test_parking_and_handover_on_redis_cluster_on_every_master(
    make_semaphore: MakeSemaphore, outbox: Outbox, redis_cluster: RedisClusterServers
) -> None:
    """All keys of a semaphore (the parking ones too) and its epoch hash are on one slot, so
    park, a release by another client that hands parked waiters over, dispatch (a
    deadline passed, a waiter dropped) and a stale copy work on Redis Cluster, for a
    semaphore on each of the three masters."""
    url = redis_cluster.url.replace("redis://", "redis+cluster://")
    with redis_cluster.client() as admin:
        on_master: dict[str, tuple[str, int]] = {}  # owning node -> (name, slot)
        for index in range(100):
            name = f"parking-{index}"
            slot = admin.cluster_keyslot(semaphore_keys(DEFAULT_NAMESPACE, name).holders)
            on_master.setdefault(admin.nodes_manager.get_node_from_slot(slot).name, (name, slot))
    assert len(on_master) == len(redis_cluster.nodes) == 3
    for owner, (name, slot) in on_master.items():
        sem = make_semaphore(1, name=name, url=url, on_handover=outbox, handover_deadline=0.2)
        other = make_semaphore(1, name=name, url=url, on_handover=outbox, handover_deadline=0.2)
        keys = sem.keys
        host, port = owner.rsplit(":", 1)
        with redis.Redis(host, int(port)) as node:
            holder = granted(sem.attempt("holder"))
            for waiter in ("a", "b", "c"):
                sem.park(waiter, f"payload-{waiter}", refused(sem.attempt(waiter)).ticket)
            assert outbox.take() == {}
            parking = keys_on_slot(node, slot, keys.call_keys)
            assert parking == set(keys.call_keys) - {keys.handed, keys.sent}

            assert other.release(holder.holder) is True  # another client's release
            first = outbox.take()
            assert list(first) == ["a", "b"]  # the free permit, and the window behind it
            assert first["a"].payload == "payload-a"
            assert states(sem) == {"a": "handed over", "b": "handed over", "c": "parked"}
            handing = keys_on_slot(node, slot, keys.call_keys)
            assert handing == set(keys.call_keys) - {keys.holders, keys.hinfo, keys.sent}

        time.sleep(0.3)  # past their deadline, and they never came
        assert sem.dispatch(drop=["b"]) == 2
        again = outbox.take()
        assert sorted(again) == ["a", "c"]  # "a" again; "c" now in the window behind it
        assert again["a"].token > first["a"].token
        permit = granted(other.attempt("a", handover=again["a"].token))
        with pytest.raises(StaleHandover):  # the other copy, after the first to arrive
            sem.attempt("a", handover=first["a"].token)
        assert states(sem) == {"c": "handed over"}

        place = refused(sem.attempt("c", handover=again["c"].token))  # early: waits
        assert permit.release() is True
        granted(sem.attempt("c", place.ticket)).release()
        assert outbox.take() == {}
        status = sem.status()
        assert (status.holder_count, status.waiter_count, status.parked_count) == (0, 0, 0)


def test_each_release_hands_over_by_the_limits_its_own_caller_enforces(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    """Two declarations of one semaphore that disagree (a rollout from shadow to
    enforced): the meta records the last acquirer's, a shadow one here, and yet the
    enforcing caller's release hands over only what its limit lets in (the free permit
    and one round behind it), not every parked waiter."""
    name = f"t-{uuid.uuid4().hex}"
    enforced = make_semaphore(1, name=name, on_handover=outbox)
    tried = make_semaphore(1, name=name, shadow=["limit"])
    holder = granted(enforced.attempt("holder"))
    for waiter in ("a", "b", "c"):
        enforced.park(waiter, f"payload-{waiter}", refused(enforced.attempt(waiter)).ticket)
    assert outbox.take() == {}
    granted(tried.attempt("shadow-holder"))  # records its declaration: a shadow limit
    holder.release()
    assert list(outbox.take()) == ["a"], "the enforced limit is full: one round behind it"


def test_one_call_hands_over_at_most_a_batch_of_parked_waiters(
    make_semaphore: MakeSemaphore, outbox: Outbox
) -> None:
    """Where nothing binds (a shadow limit), every parked waiter is due; one call looks
    at the first 1,000 in line (common_keys.lua's BATCH) and hands those over. As they
    arrive and leave the line, a later call reaches the ones behind them."""
    sem = make_semaphore(1, on_handover=outbox, shadow=["limit"])
    granted(sem.attempt("holder"))  # records the declaration; the shadow limit is full
    sem.set_draining(True)  # nothing is handed over while it drains
    for i in range(1005):
        sem.park(f"w{i:04d}", "p")
    assert outbox.take() == {}
    sem.set_draining(False)
    handed = outbox.take()
    assert sorted(handed) == [f"w{i:04d}" for i in range(1000)]
    sem.dispatch()
    assert outbox.take() == {}, "the first 1,000 in line are on their way"
    for i in range(5):
        granted(sem.attempt(f"w{i:04d}", handover=handed[f"w{i:04d}"].token))
    sem.dispatch()
    assert sorted(outbox.take()) == [f"w{i:04d}" for i in range(1000, 1005)]


def test_parking_with_the_default_order_spelt_out_keeps_the_recorded_weight(
    make_semaphore: MakeSemaphore,
) -> None:
    """``park(..., priority=0, fair_key=None)`` says nothing new about the weight: the
    waiter keeps the weight its refused attempt recorded (2 permits here); a weight
    given with it replaces it."""
    sem = make_semaphore(3, on_handover=lambda handovers: None)
    granted(sem.attempt("gate", weight=3))
    refused(sem.attempt("w", weight=2, wait_lease=120.0))
    sem.park("w", "payload", priority=0, fair_key=None)
    assert sem.client.hget(sem.keys.meta, "w|w") == b"2|2"
    sem.park("w", "payload", weight=1)
    assert sem.client.hget(sem.keys.meta, "w|w") is None  # 1|1 is not recorded


def test_parking_with_an_order_and_no_weight_parks_it_as_one(make_semaphore: MakeSemaphore) -> None:
    """``weight=None`` beside a fair key or a priority means 1, as before the Ask."""
    sem = make_semaphore(1, on_handover=lambda handovers: None)
    granted(sem.attempt("gate"))
    place = refused(sem.attempt("w", wait_lease=120.0))
    parked = sem.park("w", "payload", place.ticket, weight=None, priority=2)
    assert parked.position == 1
    assert sem.client.hget(sem.keys.meta, "w|w") == b"1|1|2"
